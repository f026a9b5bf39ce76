/* tests/layering/memory_includes_core.c — must not build (tests/layering/BUILD says why). */
#include "core/base/error.h"
#include "core/tensor.h"

size_t planted_tensor_bytes(const umt_tensor *t) { return t->bytes; }
