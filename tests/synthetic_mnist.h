/*
 * tests/synthetic_mnist.h — a tiny MNIST written by a test, in the IDX files the trainers read.
 */
#ifndef UMT_TESTS_SYNTHETIC_MNIST_H
#define UMT_TESTS_SYNTHETIC_MNIST_H

typedef enum {
    SYNTHETIC_NOISE,  /* every pixel a draw of one fixed generator: nothing to learn, a quick run */
    SYNTHETIC_STRIPES /* class c lights the rows and columns whose index % 10 is c, on black: sparse
                       * bright strokes, as MNIST's, which SGD at --lr 100 drives to NaN within ten steps */
} synthetic_pixels;

/* <dir>/<split>-images-idx3-ubyte and <split>-labels-idx1-ubyte: n images of 28 x 28, labels
 * 0..9 in turn. 0, or -1 when a file cannot be written. */
int synthetic_mnist_write(const char *dir, const char *split, int n, synthetic_pixels pixels);

#endif /* UMT_TESTS_SYNTHETIC_MNIST_H */
