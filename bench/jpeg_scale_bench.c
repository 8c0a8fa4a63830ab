/* How long libjpeg-turbo takes to decode one JPEG whole at each DCT scaling
 * m/8 (m = 8 .. 1): why DecodeSample uses only 8/8, 4/8, 2/8 and 1/8.
 * libjpeg-turbo has SIMD IDCTs for those; the others run its C IDCTs (and
 * 10x10 .. 14x14 ones for subsampled chroma), which can cost more than the
 * pixels they save.
 *
 *   cc -O2 bench/jpeg_scale_bench.c -ljpeg -o /tmp/jpeg_scale_bench
 *   /tmp/jpeg_scale_bench IMAGE.jpg
 *
 * (bench/augment_bench.py --write DIR saves the JPEGs it synthesizes.)
 *
 * Prints the median of 3 runs of 50 decodes per scale, milliseconds per
 * decode, one thread. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* After stdio.h: jpeglib.h uses FILE and size_t without including them. */
#include <jpeglib.h>

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int Less(const void* a, const void* b) {
  return *(const double*)a < *(const double*)b ? -1 : *(const double*)a > *(const double*)b;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s IMAGE.jpg\n", argv[0]);
    return 2;
  }
  FILE* f = fopen(argv[1], "rb");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  rewind(f);
  unsigned char* data = malloc(n);
  if (fread(data, 1, n, f) != (size_t)n) return 1;
  fclose(f);
  struct jpeg_decompress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_decompress(&c);
  unsigned char* out = NULL;
  for (int m = 8; m >= 1; --m) {
    double runs[3];
    for (int r = 0; r < 3; ++r) {
      const double t = Now();
      for (int k = 0; k < 50; ++k) {
        jpeg_mem_src(&c, data, n);
        jpeg_read_header(&c, TRUE);
        c.scale_num = m;
        c.scale_denom = 8;
        c.out_color_space = JCS_RGB;
        c.dct_method = JDCT_ISLOW; /* as DecodeSample */
        jpeg_start_decompress(&c);
        if (!out) out = malloc((size_t)c.output_width * c.output_height * 3);
        while (c.output_scanline < c.output_height) {
          JSAMPROW row = out + (size_t)c.output_scanline * c.output_width * 3;
          jpeg_read_scanlines(&c, &row, 1);
        }
        jpeg_finish_decompress(&c);
      }
      runs[r] = (Now() - t) / 50;
    }
    qsort(runs, 3, sizeof runs[0], Less);
    printf("%d/8  %5ux%-5u %7.2f ms\n", m, c.output_width, c.output_height, runs[1] * 1e3);
  }
  jpeg_destroy_decompress(&c);
  free(out);
  free(data);
  return 0;
}
