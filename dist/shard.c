/* dist/shard.c — each rank's part of a global batch (see umt_dist.h). */
#include "dist/umt_dist.h"

void umt_dist_shard(int64_t count, int rank, int size, int64_t *offset, int64_t *shard_count) {
    /* The first count % size ranks take one extra sample, so parts differ by at most one. */
    int64_t base = count / size, extra = count % size;
    *offset = rank * base + (rank < extra ? rank : extra);
    *shard_count = base + (rank < extra ? 1 : 0);
}

bool umt_dist_batch_usable(int64_t count, int size) { return count >= size; }
