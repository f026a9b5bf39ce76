/* core/base/dtype.c — element types' sizes and names, which every layer's messages use. */
#include "umtrain.h"

size_t umt_dtype_size(umt_dtype dtype) {
    switch (dtype) {
    case UMT_F32: return 4;
    case UMT_BF16: return 2;
    case UMT_F16: return 2;
    case UMT_I32: return 4;
    case UMT_U8: return 1;
    case UMT_DTYPE_COUNT: break;
    }
    return 0;
}

const char *umt_dtype_name(umt_dtype dtype) {
    static const char *names[UMT_DTYPE_COUNT] = {"f32", "bf16", "f16", "i32", "u8"};
    return (unsigned)dtype < UMT_DTYPE_COUNT ? names[dtype] : "invalid-dtype";
}
