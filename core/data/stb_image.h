/*
 * core/data/stb_image.h — the decoder and resizer of stb_image.c, under umtrain's names (stb's own
 * are static there). Bytes in memory only: umtrain reads and checks a file before decoding it.
 */
#ifndef UMT_CORE_DATA_STB_IMAGE_H
#define UMT_CORE_DATA_STB_IMAGE_H

/* stbi_info_from_memory: 1 and the image's sides and channels, or 0. */
int umt_stb_info(const unsigned char *bytes, int size, int *width, int *height, int *channels);
/* stbi_load_from_memory: the pixels (channels per pixel; free with umt_stb_free), or NULL. */
unsigned char *umt_stb_load(const unsigned char *bytes, int size, int *width, int *height, int *file_channels,
                            int channels);
void umt_stb_free(unsigned char *pixels);
/* Why the last decode on this thread failed. */
const char *umt_stb_failure(void);
/* stbir_resize_uint8 of tightly packed rows: 1 on success. */
int umt_stb_resize(const unsigned char *in, int in_width, int in_height, unsigned char *out, int out_width,
                   int out_height, int channels);

#endif /* UMT_CORE_DATA_STB_IMAGE_H */
