/*
 * core/data/stb_image_write.c — stb's image writer (stb_image_write 1.16), compiled from the
 * system's header for the programs that write PNG, BMP and JPEG files: the tests (their own
 * images, good and corrupt) and examples/mnist_to_png. The library itself never writes an image,
 * so this is a target of its own (core/data/BUILD), outside libumtrain. It holds no code of its
 * own: the header carries the implementation, switched on by STB_IMAGE_WRITE_IMPLEMENTATION.
 */
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
