/*
 * tests/conv_shape.h — a convolution's shape from its sizes, the output's computed as the kernels
 * compute it (the CPU kernel tests share it).
 */
#ifndef UMT_TESTS_CONV_SHAPE_H
#define UMT_TESTS_CONV_SHAPE_H

#include <stdint.h>

#include "kernels/backend.h"

static inline umt_conv_shape conv_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s,
                                        int64_t stride, int64_t pad) {
    umt_conv_shape t = {.n = n, .c = c, .h = h, .w = w, .k = k, .r = r, .s = s, .stride = stride, .pad = pad};
    t.p = (h + 2 * pad - r) / stride + 1;
    t.q = (w + 2 * pad - s) / stride + 1;
    return t;
}

#endif /* UMT_TESTS_CONV_SHAPE_H */
