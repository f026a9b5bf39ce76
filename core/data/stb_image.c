/*
 * core/data/stb_image.c — stb's image decoder and resizer, compiled here from the system's headers
 * (Debian's libstb-dev: stb_image 2.27, stb_image_resize 0.97).
 *
 * Why not link Debian's libstb.so: a prebuilt library is outside the build, so AddressSanitizer,
 * UBSan (--config=asan) and the fuzzers (tools/fuzz.sh) could not see into the decoder, which
 * reads every byte of a file a user hands to umtrain. Compiled here, it is built and instrumented
 * like the rest of core/data. This file holds no code of its own: each header carries its
 * implementation, switched on by its *_IMPLEMENTATION macro.
 *
 * The decoder's options:
 *   - STBI_ONLY_PNG, STBI_ONLY_JPEG, STBI_ONLY_BMP: the three formats umtrain promises. stb would
 *     also read GIF, PSD, HDR, PIC, PNM and TGA, code that no caller needs and that would only
 *     widen what a hostile file can reach (core/data/image_format.c refuses those files by their
 *     first bytes anyway);
 *   - STBI_NO_STDIO: no stbi_load(path) or stbi_info(path). umtrain reads a file itself, only when
 *     it is a regular file (core/base/file.h), checks its bytes and hands them to the decoder from
 *     memory: stb never opens a path, so a FIFO cannot block it and a file cannot be swapped
 *     between the check and the decode.
 * stb_image keeps its failure reason in a thread-local variable (STBI_THREAD_LOCAL, C11), so the
 * loader's threads may decode at once.
 *
 * stb's functions are static here (STB_IMAGE_STATIC, STB_IMAGE_RESIZE_STATIC): libumtrain exports
 * only the umt_stb_ functions below (stb_image.h), so an embedder that compiles its own stb gets
 * no clash of symbols.
 *
 * stb's image writer, which the tests and examples/mnist_to_png use, is compiled apart, in
 * stb_image_write.c: it is not part of the library.
 */
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_NO_STDIO
/* Static, stb's functions that no wrapper calls are unused here (the GIF loader's declaration
 * too). GCC reports them at the end of the file, so that one warning is off for this file, which
 * holds nothing of ours but the wrappers. */
#pragma GCC diagnostic ignored "-Wunused-function"
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>

#define STB_IMAGE_RESIZE_STATIC
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>

#include "core/data/stb_image.h"

int umt_stb_info(const unsigned char *bytes, int size, int *width, int *height, int *channels) {
    return stbi_info_from_memory(bytes, size, width, height, channels);
}

unsigned char *umt_stb_load(const unsigned char *bytes, int size, int *width, int *height, int *file_channels,
                            int channels) {
    return stbi_load_from_memory(bytes, size, width, height, file_channels, channels);
}

void umt_stb_free(unsigned char *pixels) { stbi_image_free(pixels); }

const char *umt_stb_failure(void) { return stbi_failure_reason(); }

int umt_stb_resize(const unsigned char *in, int in_width, int in_height, unsigned char *out, int out_width,
                   int out_height, int channels) {
    return stbir_resize_uint8(in, in_width, in_height, 0, out, out_width, out_height, 0, channels);
}
