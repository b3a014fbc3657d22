/* A native gate in front of llama.cpp's eval callback (ggml_backend_sched_eval_callback).
 *
 * llama.cpp calls the eval callback for every graph node of every decode, and the callback
 * is fixed when the context is created. A Python callback costs a ctypes round trip per
 * node even when it has nothing to do. This gate is the callback llama.cpp sees: while
 * `armed` is 0 it answers "not needed" without leaving C; while armed it forwards to the
 * Python callback. Built on first use by kvmem.engine.eval_gate (cc -O2 -shared -fPIC).
 */
#include <stdbool.h>

typedef bool (*kvmem_eval_cb)(void *tensor, bool ask, void *user_data);

struct kvmem_eval_gate {
    volatile int armed;
    kvmem_eval_cb inner;
    void *inner_user_data;
    unsigned long long calls;      /* every call, armed or not */
    unsigned long long forwarded;  /* calls passed to the inner callback */
};

bool kvmem_eval_gate(void *tensor, bool ask, void *user_data) {
    struct kvmem_eval_gate *gate = (struct kvmem_eval_gate *)user_data;
    gate->calls++;
    if (!gate->armed) {
        return false;
    }
    gate->forwarded++;
    return gate->inner(tensor, ask, gate->inner_user_data);
}
