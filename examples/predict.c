/*
 * examples/predict.c — classify image files with a trained MNIST CNN checkpoint.
 *
 *   bazel-bin/examples/mnist_cnn --epochs 5 --save cnn.ckpt
 *   bazel-bin/examples/predict --checkpoint cnn.ckpt digit.png photo.jpg scan.bmp
 *
 * Each PNG, JPEG or BMP file is read as grey, resized to 28x28 when it is not, inverted when it
 * is a dark digit on a light background (--invert auto; MNIST digits are light on dark), and
 * normalised as in training. Prints one line per file: the class and its probability.
 *
 * A checkpoint holding NaN or infinite values is refused; --allow-nonfinite loads it anyway (to
 * look into a run that diverged), and a file whose scores are then NaN gets "not a number"
 * instead of a digit, and exit status 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/example_common.h"
#include "examples/mnist_cnn_model.h"
#include "umtrain.h"

static const char *const program = "predict";

static void usage(FILE *out) {
    fprintf(out, "usage: predict --checkpoint PATH [--device cpu|cuda] [--invert auto|yes|no] [--allow-nonfinite] "
                 "IMAGE...\n");
}

typedef struct {
    const char *checkpoint;
    umt_device device;
    umt_invert invert;
    const char **images;
    int image_count;
    bool allow_nonfinite; /* load a checkpoint of NaN or infinite values */
} options;

static int parse_options(int argc, char **argv, options *o) {
    *o = (options){.device = umt_default_device(), .invert = UMT_INVERT_AUTO};
    o->images = calloc((size_t)argc, sizeof *o->images);
    for (int i = 1; o->images && i < argc; ++i) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(flag, "--", 2) != 0) {
            o->images[o->image_count++] = flag;
            continue;
        }
        if (!strcmp(flag, "--allow-nonfinite")) {
            o->allow_nonfinite = true;
            continue;
        }
        if (!value) return example_missing_value(program, flag, usage);
        i++;
        if (!strcmp(flag, "--checkpoint")) o->checkpoint = value;
        else if (!strcmp(flag, "--device")) {
            if (example_check(program, umt_device_parse(value, &o->device))) return -1;
        } else if (!strcmp(flag, "--invert")) {
            if (!strcmp(value, "auto")) o->invert = UMT_INVERT_AUTO;
            else if (!strcmp(value, "yes")) o->invert = UMT_INVERT_YES;
            else if (!strcmp(value, "no")) o->invert = UMT_INVERT_NO;
            else return fprintf(stderr, "%s: --invert '%s': expected auto, yes or no\n", program, value), -1;
        } else return fprintf(stderr, "%s: unknown flag %s\n", program, flag), usage(stderr), -1;
    }
    if (!o->checkpoint || !o->image_count) return usage(stderr), -1;
    return 0;
}

/* Classifies every image in one batch and prints a line per file; -1 if any file's scores are NaN. */
static int classify(umt_context *ctx, const mnist_cnn *model, const options *o) {
    umt_tensor *images = NULL;
    if (example_check(program, umt_images_load(ctx, o->images, o->image_count, 1, 28, 28, o->invert, MNIST_MEAN,
                                               MNIST_STD, &images)))
        return -1;
    umt_set_grad_enabled(ctx, false);
    umt_set_training(ctx, false);
    umt_tensor *log_probs = mnist_cnn_forward(ctx, model, images);
    float *host = log_probs ? malloc((size_t)o->image_count * 10 * sizeof *host) : NULL;
    if (!host || umt_tensor_copy_to_host(log_probs, host, (size_t)o->image_count * 10 * sizeof *host)) {
        free(host);
        return example_check(program, umt_last_status());
    }
    int rc = 0;
    for (int i = 0; i < o->image_count; ++i) {
        int best = 0, nan = 0;
        for (int c = 0; c < 10; ++c) nan += isnan(host[i * 10 + c]) != 0;
        for (int c = 1; c < 10; ++c)
            if (host[i * 10 + c] > host[i * 10 + best]) best = c;
        /* NaN compares false with everything, so class 0 would "win": say what it is instead. */
        if (nan) {
            printf("%s: not a number (%d of the 10 scores are NaN: the checkpoint's weights?)\n", o->images[i], nan);
            rc = -1;
        } else {
            printf("%s: %d (p = %.3f)\n", o->images[i], best, exp((double)host[i * 10 + best]));
        }
    }
    free(host);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse_options(argc, argv, &o)) {
        free(o.images);
        return 2;
    }
    umt_context_options co = umt_context_defaults();
    co.device = o.device;
    umt_context *ctx = NULL;
    mnist_cnn model;
    int rc = example_check(program, umt_context_create(&co, &ctx));
    if (!rc && mnist_cnn_build(ctx, &model)) rc = example_check(program, umt_last_status());
    umt_checkpoint_load_options lo = {.allow_nonfinite = o.allow_nonfinite};
    if (!rc) rc = example_check(program, umt_checkpoint_load_with(ctx, NULL, NULL, o.checkpoint, &lo));
    if (!rc) rc = classify(ctx, &model, &o);
    umt_context_destroy(ctx);
    free(o.images);
    return rc ? 1 : 0;
}
