/*
 * kernels/cuda/conv_engine_identity.cu — a cuDNN engine named by what identifies it, both ways:
 * from a configuration to its global index and knob values, and back to a configuration, for
 * the engine cache (kernels/engine_cache.h) to remember a choice and a later run to rebuild it
 * without asking cuDNN's heuristics; and the GPU part of the cache's keys.
 */
#include <mutex>
#include <stdio.h>
#include <string.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/conv_engine_identity.h"

/* The engine of a configuration: cuDNN's global index of it, and each knob's kind and value.
 * cuDNN hands out a configuration's knobs only into descriptors made beforehand, and a config has
 * at most one knob of each kind: CUDNN_KNOB_TYPE_COUNTS of them are made. (A build that first
 * asked for the count alone, with no array, remembered engines without their knobs: docs/PERF.md.) */
static const int KNOB_ROOM =
    (int)CUDNN_KNOB_TYPE_COUNTS < (int)UMT_ENGINE_MOST_KNOBS ? (int)CUDNN_KNOB_TYPE_COUNTS : (int)UMT_ENGINE_MOST_KNOBS;

umt_status umt_cuda_engine_identity_of(cudnnBackendDescriptor_t config, umt_engine_identity *id) {
    memset(id, 0, sizeof *id);
    cudnnBackendDescriptor_t engine = NULL, knobs[UMT_ENGINE_MOST_KNOBS] = {NULL};
    int64_t count = 0, knob_count = 0;
    int made = 0;
    cudnnStatus_t status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine);
    for (; status == CUDNN_STATUS_SUCCESS && made < KNOB_ROOM; made++)
        status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[made]);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                          &engine);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count,
                                          &id->global_index);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          KNOB_ROOM, &knob_count, knobs);
    for (int64_t k = 0; k < knob_count && k < KNOB_ROOM && status == CUDNN_STATUS_SUCCESS; k++) {
        cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_COUNTS;
        status = cudnnBackendGetAttribute(knobs[k], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &count,
                                          &type);
        if (status == CUDNN_STATUS_SUCCESS)
            status = cudnnBackendGetAttribute(knobs[k], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &count,
                                              &id->knob_value[k]);
        id->knob_type[k] = (int64_t)type;
        id->knob_count = (int)k + 1;
    }
    for (int i = 0; i < made; i++)
        if (knobs[i]) cudnnBackendDestroyDescriptor(knobs[i]);
    if (engine) cudnnBackendDestroyDescriptor(engine);
    if (status != CUDNN_STATUS_SUCCESS)
        return umt_fail(UMT_ERR_DEVICE, "conv2d: reading a cuDNN engine's index and knobs: %s",
                        cudnnGetErrorString(status));
    if (knob_count > KNOB_ROOM)
        return umt_fail(UMT_ERR_DEVICE, "conv2d: a cuDNN engine with %lld knobs (expected at most %d)",
                        (long long)knob_count, (int)KNOB_ROOM);
    return UMT_OK;
}

cudnnBackendDescriptor_t umt_cuda_engine_config_of(cudnnBackendDescriptor_t graph, const umt_engine_identity *id,
                                                   cudnnBackendDescriptor_t *parts, int *part_count) {
    cudnnBackendDescriptor_t config = NULL;
    const cudnnBackendAttributeType_t described = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    cudnnBackendDescriptor_t *engine = &parts[(*part_count)++];
    cudnnStatus_t status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, engine);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(*engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, described, 1, &graph);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(*engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                          &id->global_index);
    if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendFinalize(*engine);
    for (int k = 0; k < id->knob_count && status == CUDNN_STATUS_SUCCESS; k++) {
        cudnnBackendDescriptor_t *knob = &parts[(*part_count)++];
        cudnnBackendKnobType_t type = (cudnnBackendKnobType_t)id->knob_type[k];
        status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, knob);
        if (status == CUDNN_STATUS_SUCCESS)
            status = cudnnBackendSetAttribute(*knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type);
        if (status == CUDNN_STATUS_SUCCESS)
            status = cudnnBackendSetAttribute(*knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
                                              &id->knob_value[k]);
        if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendFinalize(*knob);
    }
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &config);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, described, 1, engine);
    if (status == CUDNN_STATUS_SUCCESS && id->knob_count)
        status = cudnnBackendSetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, described, id->knob_count,
                                          &parts[1]);
    if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendFinalize(config);
    if (status == CUDNN_STATUS_SUCCESS) return config;
    if (config) cudnnBackendDestroyDescriptor(config);
    return NULL;
}

/* The GPU part of a key, asked once a device a process (cudaGetDeviceProperties takes
 * milliseconds, and a run makes a dozen sets): its name, compute capability, multiprocessors,
 * the driver's version and cuDNN's. False when the GPU cannot be asked. */
bool umt_cuda_gpu_identity(char *out, size_t bytes) {
    enum { DEVICES = 64 };
    static std::mutex lock;
    static char identities[DEVICES][160];
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= DEVICES) return false;
    std::lock_guard<std::mutex> hold(lock);
    char *identity = identities[device];
    if (!identity[0]) {
        cudaDeviceProp prop;
        int driver = 0;
        if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaDriverGetVersion(&driver) != cudaSuccess)
            return false;
        for (char *c = prop.name; *c; c++) { /* a key has no spaces */
            bool plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                         *c == '-' || *c == '.';
            if (!plain) *c = '_';
        }
        snprintf(identity, sizeof identities[0], "%.64s/sm%d%d/%dsms/driver%d/cudnn%zu", prop.name, prop.major,
                 prop.minor, prop.multiProcessorCount, driver, cudnnGetVersion());
    }
    return (size_t)snprintf(out, bytes, "%s", identity) < bytes;
}
