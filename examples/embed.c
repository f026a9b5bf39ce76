/* examples/embed.c — the smallest program that embeds umtrain: fit y = 3x - 1 with one linear layer. */
#include <stdio.h>

#include "umtrain.h"

int main(void) {
    umt_context *ctx;
    umt_optimizer *opt;
    if (umt_context_create(NULL, &ctx) != UMT_OK) return fprintf(stderr, "%s\n", umt_last_error()), 1;
    umt_layer *fc = umt_linear_layer_new(ctx, "fc", 1, 1, true);
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 0.05f;
    if (!fc || umt_optimizer_create(ctx, &o, &opt) != UMT_OK) return fprintf(stderr, "%s\n", umt_last_error()), 1;
    float xs[4] = {0, 1, 2, 3}, minus_ys[4] = {1, -2, -5, -8}, loss_value = 0;
    for (int step = 0; step < 500; ++step) {
        umt_step_begin(ctx); /* frees the last step's activations */
        umt_zero_grad(ctx);
        umt_tensor *x = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4, 1);
        umt_tensor *minus_y = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4, 1);
        umt_tensor_copy_from_host(x, xs, sizeof xs);
        umt_tensor_copy_from_host(minus_y, minus_ys, sizeof minus_ys);
        umt_tensor *error = umt_add(ctx, umt_layer_forward(ctx, fc, x), minus_y);
        umt_tensor *loss = umt_mean(ctx, umt_mul(ctx, error, error)); /* NULL if anything failed */
        if (!loss || umt_backward(ctx, loss) || umt_optimizer_step(opt)) return fprintf(stderr, "%s\n", umt_last_error()), 1;
        umt_tensor_get_f32(loss, 0, &loss_value);
    }
    float w, b;
    umt_tensor_get_f32(umt_parameter_at(ctx, 0), 0, &w);
    umt_tensor_get_f32(umt_parameter_at(ctx, 1), 0, &b);
    printf("y = %.3f x %+.3f (loss %.2g)\n", w, b, loss_value);
    umt_context_destroy(ctx);
    return 0;
}
