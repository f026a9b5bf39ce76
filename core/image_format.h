/*
 * core/image_format.h — which files umtrain reads as images: PNG, JPEG and BMP, and nothing else.
 *
 * stb_image, which decodes them, also reads GIF, PSD, HDR, PIC, PNM and TGA, and TGA has no
 * signature: handed any other file, it may find a TGA image in it. So every image file is first
 * checked here by its first bytes (core/image.c before decoding, core/image_folder.c before
 * reading the header), and what is not one of the three is refused, its first bytes shown.
 */
#ifndef UMT_CORE_IMAGE_FORMAT_H
#define UMT_CORE_IMAGE_FORMAT_H

#include "umtrain.h"

/* UMT_OK when the file at path starts as a PNG, JPEG or BMP file does; UMT_ERR_IO when it cannot
 * be opened, UMT_ERR_FORMAT otherwise (the message names the file and its first bytes). */
umt_status umt_image_check_signature(const char *path);

#endif /* UMT_CORE_IMAGE_FORMAT_H */
