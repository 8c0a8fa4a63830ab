# Read by cpack at packaging time (CPACK_PROJECT_CONFIG_FILE).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libstoker (= ${CPACK_PACKAGE_VERSION})")
