/*
 * examples/mnist_to_png.c — writes MNIST digits as PNG files into class folders, to make an
 * image-folder tree for examples/image_folder:
 *
 *   bazel-bin/examples/mnist_to_png --data-dir data/mnist --out /tmp/digits --train 3000 --test 1000
 *   -> /tmp/digits/train/<digit>/<n>.png, /tmp/digits/test/<digit>/<n>.png
 *
 * It reads the IDX files with the library's reader (core/data/idx.h) and writes with stb_image_write.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb/stb_image_write.h>

#include "core/data/idx.h"
#include "examples/example_common.h"

static const char *const program = "mnist_to_png";

static void usage(FILE *out) {
    fprintf(out, "usage: mnist_to_png --out DIR [--data-dir DIR] [--train N] [--test N]\n"
                 "defaults: data/mnist, the first 3000 training and 1000 test images\n");
}

static int make_dir(const char *path) {
    if (mkdir(path, 0755) == 0 || errno == EEXIST) return 0;
    fprintf(stderr, "%s: cannot create %s: %s\n", program, path, strerror(errno));
    return -1;
}

/* The first count images of <dir>/<split>-* as out/<name>/<label>/<n>.png. */
static int write_split(const char *dir, const char *split, const char *out, const char *name, int64_t count) {
    char images_path[1024], labels_path[1024], path[2048];
    snprintf(images_path, sizeof images_path, "%s/%s-images-idx3-ubyte", dir, split);
    snprintf(labels_path, sizeof labels_path, "%s/%s-labels-idx1-ubyte", dir, split);
    /* The GPU bundle carries the files compressed only. */
    if (access(images_path, F_OK) != 0) strcat(images_path, ".gz");
    if (access(labels_path, F_OK) != 0) strcat(labels_path, ".gz");
    umt_idx images = {0}, labels = {0};
    if (example_check(program, umt_idx_read(images_path, &images)) ||
        example_check(program, umt_idx_read(labels_path, &labels)) ||
        example_check(program, umt_idx_check_pair(images_path, &images, labels_path, &labels, 10)) || images.ndim != 3)
        return umt_idx_free(&images), umt_idx_free(&labels), -1;
    int h = (int)images.dims[1], w = (int)images.dims[2], bad = 0;
    if (count > images.dims[0]) count = images.dims[0];
    snprintf(path, sizeof path, "%s/%s", out, name);
    bad = make_dir(path);
    for (int c = 0; c < 10 && !bad; ++c) {
        snprintf(path, sizeof path, "%s/%s/%d", out, name, c);
        bad = make_dir(path);
    }
    for (int64_t i = 0; i < count && !bad; ++i) {
        snprintf(path, sizeof path, "%s/%s/%d/%05lld.png", out, name, labels.data[i], (long long)i);
        if (!stbi_write_png(path, w, h, 1, images.data + i * h * w, w)) {
            fprintf(stderr, "%s: cannot write %s\n", program, path);
            bad = -1;
        }
    }
    printf("%s: %lld %s images in %s/%s\n", program, (long long)count, name, out, name);
    umt_idx_free(&images);
    umt_idx_free(&labels);
    return bad;
}

int main(int argc, char **argv) {
    const char *dir = "data/mnist", *out = NULL;
    double train = 3000, test = 1000;
    for (int i = 1; i < argc; i += 2) {
        const char *flag = argv[i], *value = argv[i + 1]; /* argv[argc] is NULL */
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) return usage(stdout), 0;
        if (!value) return example_missing_value(program, flag, usage), 2;
        int bad = 0;
        if (!strcmp(flag, "--data-dir")) dir = value;
        else if (!strcmp(flag, "--out")) out = value;
        else if (!strcmp(flag, "--train")) bad = example_whole_number(program, flag, value, 0, 60000, &train);
        else if (!strcmp(flag, "--test")) bad = example_whole_number(program, flag, value, 0, 10000, &test);
        else return fprintf(stderr, "%s: unknown flag %s\n", program, flag), usage(stderr), 2;
        if (bad) return 2;
    }
    if (!out) return fprintf(stderr, "%s: --out is required\n", program), usage(stderr), 2;
    if (make_dir(out) || write_split(dir, "train", out, "train", (int64_t)train) ||
        write_split(dir, "t10k", out, "test", (int64_t)test))
        return 1;
    return 0;
}
