/*
 * libQnnHtp.so adapter: lets executorch 1.5.1 (built against the QNN 2.37 headers) drive a
 * QAIRT 2.51 libQnnHtp.so, such as the one in the onnxruntime-qnn wheel.
 *
 * ExecuTorch dlopens "libQnnHtp.so" by name; this library carries that soname, so once it is
 * loaded the dynamic loader hands it out for that name. It loads the real backend by full path
 * and gives ExecuTorch a copy of the real provider table in which only deviceCreate is wrapped.
 * Two device-config facts differ between the ABIs (public QnnDevice.h / QnnHtpDevice.h):
 *   - QnnDevice_Config_t {uint32 option; union {void* customConfig; PlatformInfo*}} with
 *     option 0 points at QnnHtpDevice_CustomConfig_t {uint32 option; union {socModel, ...}}.
 *     In 2.37 every union member is 4-byte aligned, so the union sits at byte 4; 2.51 reads it
 *     at byte 8 (an 8-byte aligned union), so the SoC id landed in padding ("socModel 0").
 *   - option 1 (platform info) is not understood by 2.51 and is dropped; the SoC custom config
 *     alone is what ONNX Runtime passes too.
 * Callers that are not ExecuTorch (ONNX Runtime's QNN EP, which also asks for "libQnnHtp.so"
 * and speaks 2.51) get the real table untouched; the real table is never patched in place.
 * Built by adapter.py with -DQNN_HTP_REAL_PATH="..." and -Wl,-z,nodelete: ExecuTorch dlcloses
 * the library after its version probe, and were this one unloaded, a later dlopen by name could
 * reach the real library and bypass the adapter.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef QNN_HTP_REAL_PATH
#define QNN_HTP_REAL_PATH ""
#endif

typedef uint64_t Qnn_ErrorHandle_t;
typedef Qnn_ErrorHandle_t (*GetProvidersFn)(const void ***providers, uint32_t *count);
typedef Qnn_ErrorHandle_t (*DeviceCreateFn)(void *logger, const void **config, void **device);

#define QNN_ERROR_MEM_ALLOC 1002        /* QnnCommon.h error codes */
#define QNN_ERROR_INVALID_ARGUMENT 1004
#define QNN_ERROR_LOADING_BINARIES 1009
#define TABLE_OFFSET 40                 /* QnnInterface_t: backendId, providerName, 6 x uint32 */
#define DEVICE_CREATE_INDEX 40          /* deviceCreate's slot, the same in 2.37 and 2.51 */
#define TABLE_SLOTS 75                  /* 2.51's table (measured); 2.37's is no longer */
#define MAX_PROVIDERS 4
#define MAX_CONFIGS 64

typedef struct { uint32_t option; uint32_t pad; void *ptr; } DeviceConfig;

static unsigned char g_copies[MAX_PROVIDERS][TABLE_OFFSET + 8 * TABLE_SLOTS];
static const void *g_adapted[MAX_PROVIDERS];
static const void **g_real;
static uint32_t g_count;
static DeviceCreateFn g_real_create[MAX_PROVIDERS];
static Qnn_ErrorHandle_t g_status = QNN_ERROR_LOADING_BINARIES;
static char g_error[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint32_t g_device_creates;

static Qnn_ErrorHandle_t adapted_create(uint32_t which, void *logger, const void **config, void **device) {
    __atomic_add_fetch(&g_device_creates, 1, __ATOMIC_RELAXED);
    if (!config) return g_real_create[which](logger, config, device);
    /* Kept for the life of the process: the backend may hold on to config pointers, and a device
     * is created a handful of times per process, so the few bytes are not worth tracking. */
    DeviceConfig *copies = calloc(MAX_CONFIGS, sizeof(DeviceConfig));
    const void **list = calloc(MAX_CONFIGS + 1, sizeof(void *));
    if (!copies || !list) return QNN_ERROR_MEM_ALLOC;
    uint32_t n = 0;
    for (const void **c = config; *c && n < MAX_CONFIGS; ++c) {
        const DeviceConfig *in = *c;
        if (in->option == 1) continue;                         /* platform info: drop */
        copies[n] = *in;
        if (in->option == 0 && in->ptr) {                      /* HTP custom config: move union */
            unsigned char *custom = calloc(1, 64);
            if (!custom) return QNN_ERROR_MEM_ALLOC;
            memcpy(custom, in->ptr, 4);                        /* QnnHtpDevice_ConfigOption_t */
            memcpy(custom + 8, (const unsigned char *)in->ptr + 4, 8);  /* 2.37's 8-byte union */
            copies[n].ptr = custom;
        }
        list[n] = &copies[n];
        ++n;
    }
    return g_real_create[which](logger, list, device);
}

/* One trampoline per provider, since the QNN signature carries no user pointer. */
#define TRAMPOLINE(i) \
    static Qnn_ErrorHandle_t create_##i(void *l, const void **c, void **d) { return adapted_create(i, l, c, d); }
TRAMPOLINE(0) TRAMPOLINE(1) TRAMPOLINE(2) TRAMPOLINE(3)
static const DeviceCreateFn g_trampolines[MAX_PROVIDERS] = {create_0, create_1, create_2, create_3};

static const char *real_path(void) {
    const char *env = getenv("MODELEXPORT_QNN_HTP_REAL");     /* override, for debugging */
    return (env && *env) ? env : QNN_HTP_REAL_PATH;
}

static void init(void) {
    void *real = dlopen(real_path(), RTLD_NOW | RTLD_LOCAL);
    GetProvidersFn get = real ? (GetProvidersFn)dlsym(real, "QnnInterface_getProviders") : NULL;
    if (!get || get(&g_real, &g_count) != 0 || !g_real) {
        const char *why = get ? "QnnInterface_getProviders of the real library failed" : dlerror();
        strncpy(g_error, why ? why : "cannot load the real libQnnHtp.so", sizeof g_error - 1);
        return;
    }
    if (g_count > MAX_PROVIDERS) g_count = MAX_PROVIDERS;
    for (uint32_t i = 0; i < g_count; ++i) {
        memcpy(g_copies[i], g_real[i], sizeof g_copies[i]);
        void **table = (void **)(g_copies[i] + TABLE_OFFSET);
        g_real_create[i] = (DeviceCreateFn)table[DEVICE_CREATE_INDEX];
        if (g_real_create[i]) table[DEVICE_CREATE_INDEX] = (void *)g_trampolines[i];
        g_adapted[i] = g_copies[i];
    }
    g_status = 0;
}

/* Only ExecuTorch speaks the 2.37 ABI: decide by the file name of the calling library
 * (libexecutorch_backend_qnn.so, PyQnnManagerAdaptor*.so, qnn_executor_runner), not its folder. */
static int caller_is_executorch(const void *return_address) {
    Dl_info info;
    if (!dladdr(return_address, &info) || !info.dli_fname) return 0;
    const char *slash = strrchr(info.dli_fname, '/'), *base = slash ? slash + 1 : info.dli_fname;
    return strstr(base, "executorch") || strstr(base, "executor_runner") || strstr(base, "PyQnnManagerAdaptor");
}

__attribute__((visibility("default"), noinline))
Qnn_ErrorHandle_t QnnInterface_getProviders(const void ***providers, uint32_t *count) {
    const void *caller = __builtin_return_address(0);
    pthread_once(&g_once, init);
    if (g_status != 0) return g_status;
    if (!providers || !count) return QNN_ERROR_INVALID_ARGUMENT;
    *providers = caller_is_executorch(caller) ? g_adapted : g_real;
    *count = g_count;
    return 0;
}

/* For `modelexport doctor` and the tests. */
__attribute__((visibility("default"))) const char *QnnHtpAdapter_realPath(void) { return real_path(); }
__attribute__((visibility("default"))) const char *QnnHtpAdapter_error(void) {
    pthread_once(&g_once, init);
    return g_status == 0 ? NULL : g_error;
}
__attribute__((visibility("default"))) uint32_t QnnHtpAdapter_deviceCreateCalls(void) {
    return __atomic_load_n(&g_device_creates, __ATOMIC_RELAXED);
}
