/* Gather/scatter of KV rows between state blobs and per-block host arrays, in one call.
 *
 * kvmem.engine.kv_copy describes every copy of a restore blob build or a harvest split as
 * a list of ops and calls kvmem_copy once; ctypes releases the GIL for the whole call.
 * An op copies n_outer x n_inner elements of `el` bytes:
 *
 *     dst[o * dst_outer + i * dst_inner .. + el] = src[o * src_outer + i * src_inner .. + el]
 *
 * A contiguous run of rows is one op with n_outer = n_inner = 1 and el = its bytes; V
 * written transposed (channels x cells) or read back from that layout is one op per block
 * and layer with el = the element size. The ops' bytes are split evenly over n_threads
 * (pthreads; contiguous ops are cut at byte granularity, strided ones go whole to the
 * thread their first byte falls to). Built on first use by kvmem.engine.native_lib.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

struct kvmem_copy_op {
    uint64_t dst;
    uint64_t src;
    uint64_t n_outer;
    uint64_t n_inner;
    uint64_t el;
    int64_t dst_outer;
    int64_t src_outer;
    int64_t dst_inner;
    int64_t src_inner;
};

struct kvmem_copy_part {
    const struct kvmem_copy_op *ops;
    uint64_t n_ops;
    uint64_t lo; /* the byte range [lo, hi) of all ops' bytes this part copies */
    uint64_t hi;
};

static uint64_t op_bytes(const struct kvmem_copy_op *op) {
    return op->n_outer * op->n_inner * op->el;
}

static void copy_strided(const struct kvmem_copy_op *op) {
    for (uint64_t o = 0; o < op->n_outer; o++) {
        uint8_t *d = (uint8_t *)(uintptr_t)op->dst + (int64_t)o * op->dst_outer;
        const uint8_t *s = (const uint8_t *)(uintptr_t)op->src + (int64_t)o * op->src_outer;
        uint64_t n = op->n_inner;
        int64_t di = op->dst_inner, si = op->src_inner;
        if (op->el == 2) {
            for (uint64_t i = 0; i < n; i++) {
                uint16_t x;
                memcpy(&x, s + (int64_t)i * si, 2);
                memcpy(d + (int64_t)i * di, &x, 2);
            }
        } else if (op->el == 4) {
            for (uint64_t i = 0; i < n; i++) {
                uint32_t x;
                memcpy(&x, s + (int64_t)i * si, 4);
                memcpy(d + (int64_t)i * di, &x, 4);
            }
        } else {
            for (uint64_t i = 0; i < n; i++) {
                memcpy(d + (int64_t)i * di, s + (int64_t)i * si, op->el);
            }
        }
    }
}

static void *copy_part(void *arg) {
    const struct kvmem_copy_part *part = (const struct kvmem_copy_part *)arg;
    uint64_t at = 0; /* first byte of the current op in the sequence of all ops' bytes */
    for (uint64_t k = 0; k < part->n_ops && at < part->hi; k++) {
        const struct kvmem_copy_op *op = &part->ops[k];
        uint64_t n = op_bytes(op);
        uint64_t end = at + n;
        if (op->n_outer == 1 && op->n_inner == 1) {
            uint64_t lo = at > part->lo ? at : part->lo;
            uint64_t hi = end < part->hi ? end : part->hi;
            if (lo < hi) {
                memcpy((uint8_t *)(uintptr_t)op->dst + (lo - at),
                       (const uint8_t *)(uintptr_t)op->src + (lo - at), hi - lo);
            }
        } else if (n > 0 && at >= part->lo && at < part->hi) {
            copy_strided(op);
        }
        at = end;
    }
    return NULL;
}

/* Run n_ops ops on n_threads threads (the caller's thread is one of them). Returns the
 * number of threads used, or -1 when a thread could not be started (the copy is then
 * completed on the caller's thread). */
int kvmem_copy(const struct kvmem_copy_op *ops, uint64_t n_ops, int n_threads) {
    enum { MAX_THREADS = 64 };
    uint64_t total = 0;
    for (uint64_t k = 0; k < n_ops; k++) {
        total += op_bytes(&ops[k]);
    }
    if (n_threads < 1) {
        n_threads = 1;
    }
    if (n_threads > MAX_THREADS) {
        n_threads = MAX_THREADS;
    }
    struct kvmem_copy_part parts[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int failed = 0;
    for (int t = 0; t < n_threads; t++) {
        parts[t].ops = ops;
        parts[t].n_ops = n_ops;
        parts[t].lo = total / (uint64_t)n_threads * (uint64_t)t;
        parts[t].hi = t + 1 == n_threads ? total : total / (uint64_t)n_threads * (uint64_t)(t + 1);
    }
    for (int t = 1; t < n_threads; t++) {
        started[t] = pthread_create(&threads[t], NULL, copy_part, &parts[t]) == 0;
        failed |= !started[t];
    }
    copy_part(&parts[0]);
    for (int t = 1; t < n_threads; t++) {
        if (started[t]) {
            pthread_join(threads[t], NULL);
        } else {
            copy_part(&parts[t]);
        }
    }
    return failed ? -1 : n_threads;
}
