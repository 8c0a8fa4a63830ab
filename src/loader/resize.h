// Bilinear resize of packed RGB images (internal; used by the decode workers).
#pragma once

#include <cstdint>

namespace stoker {

// Resizes `src` (sh x sw x 3) into `dst` (dh x dw x 3) with half-pixel
// centres (align_corners=False), the convention of torchvision and PIL for
// upscaling. Separable and in fixed point (weights in 1/256): each source
// row used is resampled horizontally once into 16 bits, then each output
// row blends two of those. Within one grey level of the same filter in
// floating point; 1.23x the decode workers' samples/s of that version
// (`stoker bench loader --decode`, ~100 KB JPEGs to 224x224).
void ResizeBilinear(const uint8_t* src, uint32_t sh, uint32_t sw, uint8_t* dst, uint32_t dh,
                    uint32_t dw);

}  // namespace stoker
