/* memory/budget.c — measuring the device budget (with the GPU's ledger) and the host's available memory, and
 * parsing "2G"-style sizes. */
#include "memory/budget.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#include "memory/ledger.h"
#include "memory/pool.h"
#endif

umt_status umt_parse_bytes(const char *text, size_t *out) {
    if (!text || !out) return umt_fail_null("umt_parse_bytes", text ? "out" : "text");
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (end == text || errno || text[0] == '-')
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "size '%s': expected a number with an optional K, M, G or T", text);
    int shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10, end++; break;
    case 'M': shift = 20, end++; break;
    case 'G': shift = 30, end++; break;
    case 'T': shift = 40, end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "size '%s': unexpected '%s' (expected K, M, G or T)", text, end);
    if (value > (SIZE_MAX >> shift)) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "size '%s' is too large", text);
    *out = (size_t)value << shift;
    return UMT_OK;
}

size_t umt_budget_headroom(size_t total_bytes) {
    size_t five_percent = total_bytes / 20, floor = (size_t)512 << 20;
    return five_percent > floor ? five_percent : floor;
}

umt_status umt_budget_compute(size_t free_bytes, size_t total_bytes, const char *env_value, size_t *budget) {
    size_t headroom = umt_budget_headroom(total_bytes);
    *budget = free_bytes > headroom ? free_bytes - headroom : 0;
    if (!env_value || !*env_value) return UMT_OK;
    size_t requested = 0;
    if (umt_parse_bytes(env_value, &requested) != UMT_OK)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "UMT_DEVICE_BUDGET: %s", umt_last_error());
    /* The variable only lowers the budget: asking for more than the GPU has free could hang it. */
    if (requested < *budget) *budget = requested;
    return UMT_OK;
}

size_t umt_budget_conv_workspace_limit(size_t budget_bytes) {
    size_t least = (size_t)256 << 20, most = (size_t)8 << 30, eighth = budget_bytes / 8;
    return eighth < least ? least : eighth > most ? most : eighth;
}

size_t umt_budget_guard(size_t total_bytes) { return umt_budget_headroom(total_bytes) / 4; }

size_t umt_budget_shared(size_t budget, size_t capacity_bytes, size_t others_bytes) {
    size_t left = capacity_bytes > others_bytes ? capacity_bytes - others_bytes : 0;
    return left < budget ? left : budget;
}

size_t umt_meminfo_available_bytes(const char *meminfo) {
    const char *line = meminfo ? strstr(meminfo, "MemAvailable:") : NULL;
    if (!line) return 0;
    unsigned long long kib = strtoull(line + strlen("MemAvailable:"), NULL, 10);
    return kib > (SIZE_MAX >> 10) ? SIZE_MAX : (size_t)kib << 10;
}

size_t umt_host_available_bytes(void) {
    /* The kernel's own file, not one a caller names: read it whole, it is a few KiB. */
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return umt_meminfo_available_bytes(text);
}

#ifdef UMT_WITH_CUDA
/* Rule (c)'s measure: the GPU's free memory now (the current device is set for a thread that has
 * not used this GPU yet). */
static umt_status measure_free(int cuda_device, size_t *free_bytes) {
    size_t total_bytes = 0;
    UMT_CUDA_TRY(cudaSetDevice(cuda_device));
    UMT_CUDA_TRY(cudaMemGetInfo(free_bytes, &total_bytes));
    return UMT_OK;
}

/* The ledger's key: the GPU's UUID as nvidia-smi -L writes it, so that every process names the
 * same GPU alike whatever CUDA_VISIBLE_DEVICES numbers it. */
static umt_status ledger_key(int cuda_device, char *key, size_t size) {
    struct cudaDeviceProp prop;
    UMT_CUDA_TRY(cudaGetDeviceProperties(&prop, cuda_device));
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(key, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    return UMT_OK;
}

umt_status umt_budget_measure(int cuda_device, umt_memory *mem) {
    size_t free_bytes = 0, total_bytes = 0;
    UMT_CUDA_TRY(cudaSetDevice(cuda_device));
    UMT_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
    UMT_TRY(umt_budget_compute(free_bytes, total_bytes, getenv("UMT_DEVICE_BUDGET"), &mem->budget_bytes));
    char key[64];
    UMT_TRY(ledger_key(cuda_device, key, sizeof key));
    umt_ledger_view view;
    UMT_TRY(umt_ledger_open(umt_ledger_dir(), key, free_bytes, umt_budget_headroom(total_bytes), &mem->ledger, &view));
    /* Alone on the GPU, the capacity was just recorded from this measure: the budget is as it was. */
    mem->budget_bytes = umt_budget_shared(mem->budget_bytes, view.capacity_bytes, view.others_bytes);
    mem->guard_bytes = umt_budget_guard(total_bytes);
    mem->measure_free = measure_free;
    return UMT_OK;
}
#endif
