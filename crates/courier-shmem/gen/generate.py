#!/usr/bin/env python3
"""Generate Courier's OpenSHMEM headers and typed entry points from one set of tables.

Writes (relative to crates/courier-shmem):
  include/shmem.h     the OpenSHMEM 1.5 C API: constants, types, every typed family,
                      deprecated names, C11 _Generic interfaces
  include/shmemx.h    extensions: Open MPI's SHMEM_HINT_* names and values, semaphores
  src/typed/list.rs   which typed functions exist: a call of the family's macro per type

Usage: generate.py [OUTDIR]   (OUTDIR defaults to the crate; `make shmem-check-gen`
writes into a temporary directory and compares).
"""

import os
import subprocess
import sys

# ----- types ------------------------------------------------------------------------------
# TYPENAME: (C type, Rust type, canonical C type for _Generic de-duplication)
T = {
    "float": ("float", "f32", "float"),
    "double": ("double", "f64", "double"),
    "longdouble": ("long double", "crate::reduce::LongDouble", "long double"),
    "char": ("char", "std::ffi::c_char", "char"),
    "schar": ("signed char", "i8", "signed char"),
    "short": ("short", "i16", "short"),
    "int": ("int", "i32", "int"),
    "long": ("long", "i64", "long"),
    "longlong": ("long long", "i64", "long long"),
    "uchar": ("unsigned char", "u8", "unsigned char"),
    "ushort": ("unsigned short", "u16", "unsigned short"),
    "uint": ("unsigned int", "u32", "unsigned int"),
    "ulong": ("unsigned long", "u64", "unsigned long"),
    "ulonglong": ("unsigned long long", "u64", "unsigned long long"),
    "int8": ("int8_t", "i8", "signed char"),
    "int16": ("int16_t", "i16", "short"),
    "int32": ("int32_t", "i32", "int"),
    "int64": ("int64_t", "i64", "long"),
    "uint8": ("uint8_t", "u8", "unsigned char"),
    "uint16": ("uint16_t", "u16", "unsigned short"),
    "uint32": ("uint32_t", "u32", "unsigned int"),
    "uint64": ("uint64_t", "u64", "unsigned long"),
    "size": ("size_t", "usize", "unsigned long"),
    "ptrdiff": ("ptrdiff_t", "isize", "long"),
    "complexf": ("float _Complex", "crate::reduce::Complex<f32>", "float _Complex"),
    "complexd": ("double _Complex", "crate::reduce::Complex<f64>", "double _Complex"),
}

RMA = ["float", "double", "longdouble", "char", "schar", "short", "int", "long", "longlong",
       "uchar", "ushort", "uint", "ulong", "ulonglong", "int8", "int16", "int32", "int64",
       "uint8", "uint16", "uint32", "uint64", "size", "ptrdiff"]
AMO_STD = ["int", "long", "longlong", "uint", "ulong", "ulonglong", "int32", "int64", "uint32",
           "uint64", "size", "ptrdiff"]
AMO_EXT = ["float", "double"] + AMO_STD
AMO_BIT = ["uint", "ulong", "ulonglong", "int32", "int64", "uint32", "uint64"]
WAIT = ["short", "int", "long", "longlong", "ushort", "uint", "ulong", "ulonglong", "int32",
        "int64", "uint32", "uint64", "size", "ptrdiff"]
RED_BIT = ["uchar", "ushort", "uint", "ulong", "ulonglong", "int8", "int16", "int32", "int64",
           "uint8", "uint16", "uint32", "uint64", "size"]
RED_ORD = ["char", "schar", "short", "int", "long", "longlong", "ptrdiff", "uchar", "ushort",
           "uint", "ulong", "ulonglong", "int8", "int16", "int32", "int64", "uint8", "uint16",
           "uint32", "uint64", "size", "float", "double", "longdouble"]
RED_ARITH = RED_ORD + ["complexf", "complexd"]
TOALL = {
    "and": ["short", "int", "long", "longlong"],
    "or": ["short", "int", "long", "longlong"],
    "xor": ["short", "int", "long", "longlong"],
    "max": ["short", "int", "long", "longlong", "float", "double", "longdouble"],
    "min": ["short", "int", "long", "longlong", "float", "double", "longdouble"],
    "sum": ["short", "int", "long", "longlong", "float", "double", "longdouble", "complexf", "complexd"],
    "prod": ["short", "int", "long", "longlong", "float", "double", "longdouble", "complexf", "complexd"],
}
REDUCE = {"and": RED_BIT, "or": RED_BIT, "xor": RED_BIT, "max": RED_ORD, "min": RED_ORD,
          "sum": RED_ARITH, "prod": RED_ARITH}
SIZES = {"8": "u8", "16": "u16", "32": "u32", "64": "u64", "128": "u128"}

# Atomics: (C name suffix, kind) of each group; src/typed/amo.rs writes the same groups.
STD_AMO = [("atomic_fetch_inc", "fetch_inc"), ("atomic_inc", "inc"), ("atomic_fetch_add", "fetch_add"),
           ("atomic_add", "add"), ("atomic_compare_swap", "cswap"), ("atomic_fetch_inc_nbi", "fetch_inc_nbi"),
           ("atomic_fetch_add_nbi", "fetch_add_nbi"), ("atomic_compare_swap_nbi", "cswap_nbi")]
EXT_AMO = [("atomic_fetch", "fetch"), ("atomic_set", "set"), ("atomic_swap", "swap"),
           ("atomic_fetch_nbi", "fetch_nbi"), ("atomic_swap_nbi", "swap_nbi")]
BIT_AMO = [(f"atomic_{k}", k) for k in ["fetch_and", "and", "fetch_or", "or", "fetch_xor", "xor",
                                          "fetch_and_nbi", "fetch_or_nbi", "fetch_xor_nbi"]]
DEP_AMO = [("fadd", "fetch_add"), ("finc", "fetch_inc"), ("add", "add"), ("inc", "inc"), ("cswap", "cswap")]
DEP_EXT = [("swap", "swap"), ("fetch", "fetch"), ("set", "set")]
DEP_AMO_TYPES = ["int", "long", "longlong"]
DEP_EXT_TYPES = ["int", "long", "longlong", "float", "double"]
WAIT_DEP = ["short", "int", "long", "longlong"]

# Types whose values cannot cross a Rust `extern "C"` signature (x87 long double): their
# `p`/`g` are static inline in the header, through `put`/`get`.
INLINE_PG = {"longdouble"}


def c(t):
    return T[t][0]


def r(t):
    return T[t][1]


# ----- Rust -------------------------------------------------------------------------------
# src/typed/list.rs: one call per type of the macros in src/typed/{rma,signal,amo,wait,coll,
# reduce}.rs, which write each family's functions for that type.

def bits_mod(s):
    return f"bits{s}"


def gen_typed_list():
    out = ["//! Which typed functions exist: one call of a family's macro (in the file named after",
           "//! the family) per OpenSHMEM type, from the tables that also write `include/shmem.h`.",
           "//!",
           "//! Generated by `gen/generate.py`: do not edit.",
           ""]

    def module(name, doc, lines):
        out.append(f"/// {doc}")
        out.append(f"pub mod {name} {{")
        out.extend(f"    {l}" for l in lines)
        out.append("}")
        out.append("")

    module("rma", "Puts, gets, `p`/`g`, strided and `_nbi` forms.",
           [f"rma_typed!({t}, {r(t)}{'' if t in INLINE_PG else ', pg'});" for t in RMA]
           + [f'rma_sized!({bits_mod(s)}, "{s}", {ty});' for s, ty in SIZES.items()])
    module("signal", "Put-with-signal.",
           [f"signal_put!({t}, {r(t)});" for t in RMA]
           + [f'signal_put!({bits_mod(s)}, "{s}", {ty});' for s, ty in SIZES.items()])
    module("amo_standard", "Standard atomics.", [f"amo_standard!({t}, {r(t)});" for t in AMO_STD])
    module("amo_extended", "Extended atomics.", [f"amo_extended!({t}, {r(t)});" for t in AMO_EXT])
    module("amo_bitwise", "Bitwise atomics.", [f"amo_bitwise!({t}, {r(t)});" for t in AMO_BIT])
    module("amo_deprecated", "The deprecated names of the atomics.",
           [f"amo_deprecated!({t}, {r(t)});" for t in DEP_AMO_TYPES])
    module("amo_deprecated_extended", "The deprecated names of the extended atomics.",
           [f"amo_deprecated_extended!({t}, {r(t)});" for t in DEP_EXT_TYPES])
    module("wait", "Point-to-point synchronization.", [f"wait_typed!({t}, {r(t)});" for t in WAIT])
    module("wait_deprecated", "The deprecated `shmem_T_wait`.",
           [f"wait_deprecated!({t}, {r(t)});" for t in WAIT_DEP])
    module("coll", "Collectives on teams.", [f"coll_team!({t}, {r(t)});" for t in RMA])

    def op_lists(macro, table):
        # Operations that take the same types share one call (one module each).
        groups = {}
        for op, types in table.items():
            groups.setdefault(tuple(types), []).append(op)
        lines = []
        for types, ops in groups.items():
            lines.append(f"{macro}!(")
            lines.append(f"    [{', '.join(ops)}]: [")
            lines.extend(f"        {t} {r(t)}," for t in types)
            lines.append("    ]")
            lines.append(");")
        return lines

    module("reduce", "Reductions on teams.", op_lists("reduce_team", REDUCE))
    module("to_all", "The deprecated active-set reductions.", op_lists("reduce_active", TOALL))
    return "\n".join(out)


# ----- C header ---------------------------------------------------------------------------
HEAD = r"""/* OpenSHMEM 1.5 on Courier.
 *
 * Generated by crates/courier-shmem/gen/generate.py: do not edit. */
#ifndef COURIER_SHMEM_H
#define COURIER_SHMEM_H

#include <stddef.h>
#include <stdint.h>
#if !defined(__cplusplus)
#include <complex.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define SHMEM_MAJOR_VERSION 1
#define SHMEM_MINOR_VERSION 5
#define _SHMEM_MAJOR_VERSION SHMEM_MAJOR_VERSION
#define _SHMEM_MINOR_VERSION SHMEM_MINOR_VERSION
#define SHMEM_MAX_NAME_LEN 256
#define _SHMEM_MAX_NAME_LEN SHMEM_MAX_NAME_LEN
#define SHMEM_VENDOR_STRING "Courier OpenSHMEM @VERSION@"
#define _SHMEM_VENDOR_STRING SHMEM_VENDOR_STRING

#define SHMEM_THREAD_SINGLE 0
#define SHMEM_THREAD_FUNNELED 1
#define SHMEM_THREAD_SERIALIZED 2
#define SHMEM_THREAD_MULTIPLE 3

#define SHMEM_CMP_EQ 1
#define SHMEM_CMP_NE 2
#define SHMEM_CMP_GT 3
#define SHMEM_CMP_GE 4
#define SHMEM_CMP_LT 5
#define SHMEM_CMP_LE 6
#define _SHMEM_CMP_EQ SHMEM_CMP_EQ
#define _SHMEM_CMP_NE SHMEM_CMP_NE
#define _SHMEM_CMP_GT SHMEM_CMP_GT
#define _SHMEM_CMP_GE SHMEM_CMP_GE
#define _SHMEM_CMP_LT SHMEM_CMP_LT
#define _SHMEM_CMP_LE SHMEM_CMP_LE

#define SHMEM_SIGNAL_SET 0
#define SHMEM_SIGNAL_ADD 1

#define SHMEM_CTX_PRIVATE (1L << 0)
#define SHMEM_CTX_SERIALIZED (1L << 1)
#define SHMEM_CTX_NOSTORE (1L << 2)

#define SHMEM_MALLOC_ATOMICS_REMOTE (1L << 0)
#define SHMEM_MALLOC_SIGNAL_REMOTE (1L << 1)

#define SHMEM_TEAM_NUM_CONTEXTS (1L << 0)

/* Courier's collectives keep their state in the library: pSync and pWrk are accepted
 * and left untouched; the sizes are those programs expect. */
#define SHMEM_SYNC_VALUE 0L
#define SHMEM_SYNC_SIZE 4
#define SHMEM_BCAST_SYNC_SIZE 4
#define SHMEM_BARRIER_SYNC_SIZE 4
#define SHMEM_REDUCE_SYNC_SIZE 4
#define SHMEM_COLLECT_SYNC_SIZE 4
#define SHMEM_ALLTOALL_SYNC_SIZE 4
#define SHMEM_ALLTOALLS_SYNC_SIZE 4
#define SHMEM_REDUCE_MIN_WRKDATA_SIZE 1
#define _SHMEM_SYNC_VALUE SHMEM_SYNC_VALUE
#define _SHMEM_BCAST_SYNC_SIZE SHMEM_BCAST_SYNC_SIZE
#define _SHMEM_BARRIER_SYNC_SIZE SHMEM_BARRIER_SYNC_SIZE
#define _SHMEM_REDUCE_SYNC_SIZE SHMEM_REDUCE_SYNC_SIZE
#define _SHMEM_COLLECT_SYNC_SIZE SHMEM_COLLECT_SYNC_SIZE
#define _SHMEM_ALLTOALL_SYNC_SIZE SHMEM_ALLTOALL_SYNC_SIZE
#define _SHMEM_ALLTOALLS_SYNC_SIZE SHMEM_ALLTOALLS_SYNC_SIZE
#define _SHMEM_REDUCE_MIN_WRKDATA_SIZE SHMEM_REDUCE_MIN_WRKDATA_SIZE

typedef struct courier_shmem_ctx *shmem_ctx_t;
typedef struct courier_shmem_team *shmem_team_t;
typedef struct {
    int num_contexts;
} shmem_team_config_t;

extern shmem_ctx_t SHMEM_CTX_DEFAULT;
#define SHMEM_CTX_INVALID ((shmem_ctx_t) 0)
extern shmem_team_t SHMEM_TEAM_WORLD;
extern shmem_team_t SHMEM_TEAM_SHARED;
#define SHMEM_TEAM_INVALID ((shmem_team_t) 0)

/* Setup, exit, query */
void shmem_init(void);
int shmem_init_thread(int requested, int *provided);
void shmem_query_thread(int *provided);
void shmem_finalize(void);
void shmem_global_exit(int status);
int shmem_my_pe(void);
int shmem_n_pes(void);
int shmem_pe_accessible(int pe);
int shmem_addr_accessible(const void *addr, int pe);
void *shmem_ptr(const void *dest, int pe);
void *shmem_team_ptr(shmem_team_t team, const void *dest, int pe);
void shmem_info_get_version(int *major, int *minor);
void shmem_info_get_name(char *name);
void shmem_pcontrol(const int level, ...);
void start_pes(int npes);
int _my_pe(void);
int _num_pes(void);

/* Memory */
void *shmem_malloc(size_t size);
void *shmem_calloc(size_t count, size_t size);
void *shmem_align(size_t alignment, size_t size);
void *shmem_realloc(void *ptr, size_t size);
void shmem_free(void *ptr);
void *shmem_malloc_with_hints(size_t size, long hints);
void *shmalloc(size_t size);
void *shmemalign(size_t alignment, size_t size);
void *shrealloc(void *ptr, size_t size);
void shfree(void *ptr);

/* Teams and contexts */
int shmem_team_my_pe(shmem_team_t team);
int shmem_team_n_pes(shmem_team_t team);
int shmem_team_get_config(shmem_team_t team, long config_mask, shmem_team_config_t *config);
int shmem_team_translate_pe(shmem_team_t src_team, int src_pe, shmem_team_t dest_team);
int shmem_team_split_strided(shmem_team_t parent_team, int start, int stride, int size,
                             const shmem_team_config_t *config, long config_mask,
                             shmem_team_t *new_team);
int shmem_team_split_2d(shmem_team_t parent_team, int xrange,
                        const shmem_team_config_t *xaxis_config, long xaxis_mask,
                        shmem_team_t *xaxis_team, const shmem_team_config_t *yaxis_config,
                        long yaxis_mask, shmem_team_t *yaxis_team);
void shmem_team_destroy(shmem_team_t team);
int shmem_ctx_create(long options, shmem_ctx_t *ctx);
int shmem_team_create_ctx(shmem_team_t team, long options, shmem_ctx_t *ctx);
void shmem_ctx_destroy(shmem_ctx_t ctx);
int shmem_ctx_get_team(shmem_ctx_t ctx, shmem_team_t *team);

/* Ordering, synchronization, locks, signals */
void shmem_fence(void);
void shmem_ctx_fence(shmem_ctx_t ctx);
void shmem_quiet(void);
void shmem_ctx_quiet(shmem_ctx_t ctx);
void shmem_barrier_all(void);
void shmem_barrier(int PE_start, int logPE_stride, int PE_size, long *pSync);
void shmem_sync_all(void);
void shmem_sync(int PE_start, int logPE_stride, int PE_size, long *pSync);
int shmem_team_sync(shmem_team_t team);
void shmem_set_lock(long *lock);
void shmem_clear_lock(long *lock);
int shmem_test_lock(long *lock);
uint64_t shmem_signal_fetch(const uint64_t *sig_addr);
uint64_t shmem_signal_wait_until(uint64_t *sig_addr, int cmp, uint64_t cmp_value);

/* Deprecated cache management (no effect: Courier's memory is coherent) */
void shmem_clear_cache_inv(void);
void shmem_set_cache_inv(void);
void shmem_clear_cache_line_inv(void *dest);
void shmem_set_cache_line_inv(void *dest);
void shmem_udcflush(void);
void shmem_udcflush_line(void *dest);
"""

TAIL = r"""
#ifdef __cplusplus
}
#endif

#endif /* COURIER_SHMEM_H */
"""


class H:
    def __init__(self):
        self.lines = []

    def decl(self, text):
        self.lines.append(text)


def cparams(ps):
    return ", ".join(ps)


def header(version):
    h = [HEAD.replace("@VERSION@", version)]
    h.append("/* RMA */")
    for t in RMA:
        ty = c(t)
        for ctx in (False, True):
            pre = "shmem_ctx_" if ctx else "shmem_"
            cx = ["shmem_ctx_t ctx"] if ctx else []
            for op in ["put", "get", "put_nbi", "get_nbi"]:
                h.append(f"void {pre}{t}_{op}({cparams(cx + [f'{ty} *dest', f'const {ty} *source', 'size_t nelems', 'int pe'])});")
            for op in ["iput", "iget"]:
                h.append(f"void {pre}{t}_{op}({cparams(cx + [f'{ty} *dest', f'const {ty} *source', 'ptrdiff_t dst', 'ptrdiff_t sst', 'size_t nelems', 'int pe'])});")
            if t in INLINE_PG:
                args = "ctx, " if ctx else ""
                h.append(f"static inline void {pre}{t}_p({cparams(cx + [f'{ty} *dest', f'{ty} value', 'int pe'])}) {{ {pre}{t}_put({args}dest, &value, 1, pe); }}")
                h.append(f"static inline {ty} {pre}{t}_g({cparams(cx + [f'const {ty} *source', 'int pe'])}) {{ {ty} v; {pre}{t}_get({args}&v, source, 1, pe); return v; }}")
            else:
                h.append(f"void {pre}{t}_p({cparams(cx + [f'{ty} *dest', f'{ty} value', 'int pe'])});")
                h.append(f"{ty} {pre}{t}_g({cparams(cx + [f'const {ty} *source', 'int pe'])});")
            for op in ["put_signal", "put_signal_nbi"]:
                h.append(f"void {pre}{t}_{op}({cparams(cx + [f'{ty} *dest', f'const {ty} *source', 'size_t nelems', 'uint64_t *sig_addr', 'uint64_t signal', 'int sig_op', 'int pe'])});")
    for s in list(SIZES) + ["mem"]:
        for ctx in (False, True):
            pre = "shmem_ctx_" if ctx else "shmem_"
            cx = ["shmem_ctx_t ctx"] if ctx else []
            for op in ["put", "get"]:
                for nbi in ["", "_nbi"]:
                    h.append(f"void {pre}{op}{s}{nbi}({cparams(cx + ['void *dest', 'const void *source', 'size_t nelems', 'int pe'])});")
            if s != "mem":
                for op in ["iput", "iget"]:
                    h.append(f"void {pre}{op}{s}({cparams(cx + ['void *dest', 'const void *source', 'ptrdiff_t dst', 'ptrdiff_t sst', 'size_t nelems', 'int pe'])});")
            for nbi in ["", "_nbi"]:
                h.append(f"void {pre}put{s}_signal{nbi}({cparams(cx + ['void *dest', 'const void *source', 'size_t nelems', 'uint64_t *sig_addr', 'uint64_t signal', 'int sig_op', 'int pe'])});")
    h.append("\n/* Atomics */")

    def amo_decl(t, names, ctx_too):
        ty = c(t)
        for ctx in ((False, True) if ctx_too else (False,)):
            pre = "shmem_ctx_" if ctx else "shmem_"
            cx = ["shmem_ctx_t ctx"] if ctx else []
            d, v, pe, fe = f"{ty} *dest", f"{ty} value", "int pe", f"{ty} *fetch"
            for suffix, kind in names:
                n = f"{pre}{t}_{suffix}"
                sig = {
                    "fetch_inc": (ty, [d, pe]), "inc": ("void", [d, pe]),
                    "fetch_add": (ty, [d, v, pe]), "fetch_and": (ty, [d, v, pe]), "fetch_or": (ty, [d, v, pe]),
                    "fetch_xor": (ty, [d, v, pe]), "swap": (ty, [d, v, pe]),
                    "add": ("void", [d, v, pe]), "and": ("void", [d, v, pe]), "or": ("void", [d, v, pe]),
                    "xor": ("void", [d, v, pe]), "set": ("void", [d, v, pe]),
                    "cswap": (ty, [d, f"{ty} cond", v, pe]), "fetch": (ty, [f"const {ty} *source", pe]),
                    "fetch_inc_nbi": ("void", [fe, d, pe]),
                    "fetch_add_nbi": ("void", [fe, d, v, pe]), "fetch_and_nbi": ("void", [fe, d, v, pe]),
                    "fetch_or_nbi": ("void", [fe, d, v, pe]), "fetch_xor_nbi": ("void", [fe, d, v, pe]),
                    "swap_nbi": ("void", [fe, d, v, pe]), "cswap_nbi": ("void", [fe, d, f"{ty} cond", v, pe]),
                    "fetch_nbi": ("void", [fe, f"const {ty} *source", pe]),
                }[kind]
                h.append(f"{sig[0]} {n}({cparams(cx + sig[1])});")

    for t in AMO_STD:
        amo_decl(t, STD_AMO, True)
    for t in AMO_EXT:
        amo_decl(t, EXT_AMO, True)
    for t in AMO_BIT:
        amo_decl(t, BIT_AMO, True)
    for t in DEP_AMO_TYPES:
        amo_decl(t, DEP_AMO, False)
    for t in DEP_EXT_TYPES:
        amo_decl(t, DEP_EXT, False)
    h.append("long shmem_swap(long *dest, long value, int pe);")

    h.append("\n/* Point-to-point synchronization */")
    for t in WAIT:
        ty = c(t)
        iv, n, st, idx = f"{ty} *ivars", "size_t nelems", "const int *status", "size_t *indices"
        h.append(f"void shmem_{t}_wait_until({ty} *ivar, int cmp, {ty} cmp_value);")
        h.append(f"int shmem_{t}_test({ty} *ivar, int cmp, {ty} cmp_value);")
        for sfx, last in [("", f"{ty} cmp_value"), ("_vector", f"const {ty} *cmp_values")]:
            h.append(f"void shmem_{t}_wait_until_all{sfx}({cparams([iv, n, st, 'int cmp', last])});")
            h.append(f"size_t shmem_{t}_wait_until_any{sfx}({cparams([iv, n, st, 'int cmp', last])});")
            h.append(f"size_t shmem_{t}_wait_until_some{sfx}({cparams([iv, n, idx, st, 'int cmp', last])});")
            h.append(f"int shmem_{t}_test_all{sfx}({cparams([iv, n, st, 'int cmp', last])});")
            h.append(f"size_t shmem_{t}_test_any{sfx}({cparams([iv, n, st, 'int cmp', last])});")
            h.append(f"size_t shmem_{t}_test_some{sfx}({cparams([iv, n, idx, st, 'int cmp', last])});")
    for t in WAIT_DEP:
        h.append(f"void shmem_{t}_wait({c(t)} *ivar, {c(t)} cmp_value);")
    h.append("void shmem_wait(long *ivar, long cmp_value);")
    h.append("void shmem_wait_until(long *ivar, int cmp, long cmp_value);")

    h.append("\n/* Collectives */")
    act = "int PE_start, int logPE_stride, int PE_size, long *pSync"
    for t in RMA + ["mem"]:
        ty = "void" if t == "mem" else c(t)
        pre = "" if t == "mem" else f"{t}_"
        suf = "mem" if t == "mem" else ""
        base = f"shmem_team_t team, {ty} *dest, const {ty} *source"
        h.append(f"int shmem_{pre}broadcast{suf}({base}, size_t nelems, int PE_root);")
        for op in ["collect", "fcollect", "alltoall"]:
            h.append(f"int shmem_{pre}{op}{suf}({base}, size_t nelems);")
        h.append(f"int shmem_{pre}alltoalls{suf}({base}, ptrdiff_t dst, ptrdiff_t sst, size_t nelems);")
    for bits in ["32", "64"]:
        h.append(f"void shmem_broadcast{bits}(void *dest, const void *source, size_t nelems, int PE_root, {act});")
        for op in ["collect", "fcollect", "alltoall"]:
            h.append(f"void shmem_{op}{bits}(void *dest, const void *source, size_t nelems, {act});")
        h.append(f"void shmem_alltoalls{bits}(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, {act});")
    for op, types in REDUCE.items():
        for t in types:
            h.append(f"int shmem_{t}_{op}_reduce(shmem_team_t team, {c(t)} *dest, const {c(t)} *source, size_t nreduce);")
    for op, types in TOALL.items():
        for t in types:
            h.append(f"void shmem_{t}_{op}_to_all({c(t)} *dest, const {c(t)} *source, int nreduce, int PE_start, int logPE_stride, int PE_size, {c(t)} *pWrk, long *pSync);")

    h.append(c11())
    h.append(TAIL)
    return "\n".join(h)


def dedupe(types):
    seen, out = set(), []
    for t in types:
        if T[t][2] not in seen:
            seen.add(T[t][2])
            out.append(t)
    return out


def gen_list(types, fmt, const=False, extra_const=False):
    """_Generic associations: `TYPE *: fmt(t)` for each distinct C type."""
    items = []
    for t in dedupe(types):
        items.append(f"{c(t)} *: {fmt(t)}")
        if extra_const:
            items.append(f"const {c(t)} *: {fmt(t)}")
    return ", ".join(items)


def c11():
    out = ["""
/* C11 type-generic interfaces */
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__cplusplus)
void shmem_c11_type_not_supported(void);
#define SHMEM_C11_A0(A, ...) A
#define SHMEM_C11_A1(A, B, ...) B
#define SHMEM_C11_BAD default: shmem_c11_type_not_supported
"""]
    std_rma = [t for t in RMA if t not in ("size", "ptrdiff")]

    def ctx_generic(name, types, fmt, fmt_ctx, const=False):
        """Dispatch on arg 0 (or arg 1 after a context)."""
        plain = gen_list(types, fmt, extra_const=const)
        withc = gen_list(types, fmt_ctx, extra_const=const)
        out.append(
            f"#define {name}(...) _Generic(SHMEM_C11_A0(__VA_ARGS__, 0), "
            f"shmem_ctx_t: _Generic(SHMEM_C11_A1(__VA_ARGS__, 0, 0), {withc}, SHMEM_C11_BAD), "
            f"{plain}, SHMEM_C11_BAD)(__VA_ARGS__)")

    for op in ["put", "get", "put_nbi", "get_nbi", "iput", "iget", "p", "put_signal", "put_signal_nbi"]:
        ctx_generic(f"shmem_{op}", std_rma, lambda t, op=op: f"shmem_{t}_{op}", lambda t, op=op: f"shmem_ctx_{t}_{op}")
    ctx_generic("shmem_g", std_rma, lambda t: f"shmem_{t}_g", lambda t: f"shmem_ctx_{t}_g", const=True)
    amo_std = [t for t in AMO_STD if t not in ("size", "ptrdiff")]
    amo_ext = ["float", "double"] + amo_std
    amo_bit = AMO_BIT
    for sfx, types, const in [
        ("atomic_fetch_inc", amo_std, False), ("atomic_inc", amo_std, False), ("atomic_fetch_add", amo_std, False),
        ("atomic_add", amo_std, False), ("atomic_compare_swap", amo_std, False), ("atomic_fetch", amo_ext, True),
        ("atomic_set", amo_ext, False), ("atomic_swap", amo_ext, False),
        ("atomic_fetch_and", amo_bit, False), ("atomic_and", amo_bit, False), ("atomic_fetch_or", amo_bit, False),
        ("atomic_or", amo_bit, False), ("atomic_fetch_xor", amo_bit, False), ("atomic_xor", amo_bit, False),
        ("atomic_fetch_inc_nbi", amo_std, False), ("atomic_fetch_add_nbi", amo_std, False),
        ("atomic_compare_swap_nbi", amo_std, False), ("atomic_fetch_nbi", amo_ext, False),
        ("atomic_swap_nbi", amo_ext, False), ("atomic_fetch_and_nbi", amo_bit, False),
        ("atomic_fetch_or_nbi", amo_bit, False), ("atomic_fetch_xor_nbi", amo_bit, False),
    ]:
        ctx_generic(f"shmem_{sfx}", types, lambda t, s=sfx: f"shmem_{t}_{s}", lambda t, s=sfx: f"shmem_ctx_{t}_{s}", const=const)
    # Deprecated generic atomics (no context form).
    for sfx, types, const in [("fadd", ["int", "long", "longlong"], False), ("finc", ["int", "long", "longlong"], False),
                              ("add", ["int", "long", "longlong"], False), ("inc", ["int", "long", "longlong"], False),
                              ("cswap", ["int", "long", "longlong"], False),
                              ("swap", ["int", "long", "longlong", "float", "double"], False),
                              ("fetch", ["int", "long", "longlong", "float", "double"], True),
                              ("set", ["int", "long", "longlong", "float", "double"], False)]:
        out.append(f"#define shmem_{sfx}(dest, ...) _Generic((dest), {gen_list(types, lambda t, s=sfx: f'shmem_{t}_{s}', extra_const=const)}, SHMEM_C11_BAD)(dest, __VA_ARGS__)")
    wait = [t for t in WAIT if t not in ("size", "ptrdiff")]
    for sfx in ["wait_until", "wait_until_all", "wait_until_any", "wait_until_some", "wait_until_all_vector",
                "wait_until_any_vector", "wait_until_some_vector", "test", "test_all", "test_any", "test_some",
                "test_all_vector", "test_any_vector", "test_some_vector"]:
        out.append(f"#define shmem_{sfx}(ivars, ...) _Generic((ivars), {gen_list(wait, lambda t, s=sfx: f'shmem_{t}_{s}')}, SHMEM_C11_BAD)(ivars, __VA_ARGS__)")
    for op in ["broadcast", "collect", "fcollect", "alltoall", "alltoalls"]:
        out.append(f"#define shmem_{op}(team, dest, ...) _Generic((dest), {gen_list(std_rma, lambda t, o=op: f'shmem_{t}_{o}')}, SHMEM_C11_BAD)(team, dest, __VA_ARGS__)")
    for op, types in REDUCE.items():
        out.append(f"#define shmem_{op}_reduce(team, dest, ...) _Generic((dest), {gen_list(types, lambda t, o=op: f'shmem_{t}_{o}_reduce')}, SHMEM_C11_BAD)(team, dest, __VA_ARGS__)")
    out.append("""/* shmem_sync(team) is the 1.5 form; shmem_sync(PE_start, logPE_stride, PE_size, pSync)
 * the deprecated one. */
#define SHMEM_C11_SYNC_PICK(_1, _2, _3, _4, NAME, ...) NAME
#define shmem_sync(...) SHMEM_C11_SYNC_PICK(__VA_ARGS__, shmem_sync, shmem_c11_type_not_supported, shmem_c11_type_not_supported, shmem_team_sync, 0)(__VA_ARGS__)
#endif /* C11 */""")
    return "\n".join(out)


SHMEMX = r"""/* Courier's OpenSHMEM extensions.
 *
 * Generated by crates/courier-shmem/gen/generate.py: do not edit. */
#ifndef COURIER_SHMEMX_H
#define COURIER_SHMEMX_H

#include <shmem.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Open MPI's allocation hints, so that programs written for OSHMEM compile. A
 * SHMEM_HINT_DEVICE_NIC_MEM block is host memory where no NIC memory exists (here: said
 * once at COURIER_LOG_LEVEL=info). */
#define SHMEM_HINT_NONE 0
#define SHMEM_HINT_LOW_LAT_MEM (1 << 0)
#define SHMEM_HINT_HIGH_BW_MEM (1 << 1)
#define SHMEM_HINT_NEAR_NIC_MEM (1 << 2)
#define SHMEM_HINT_DEVICE_GPU_MEM (1 << 3)
#define SHMEM_HINT_DEVICE_NIC_MEM (1 << 4)
#define SHMEM_HINT_PSYNC (1 << 16)
#define SHMEM_HINT_PWORK (1 << 17)
#define SHMEM_HINT_ATOMICS (1 << 18)

/* Open MPI's name for shmem_malloc_with_hints. */
void *shmemx_malloc_with_hint(size_t size, long hint);

/* Semaphores in the style of Berkeley UPC's bupc_sem_t, and a put that signals one.
 *
 * A semaphore belongs to the PE that allocates it (shmemx_sem_alloc is not collective)
 * and lives in that PE's symmetric heap (up to SHMEMX_SEM_MAX per PE). Its handle is a
 * plain 64-bit value: send it to the PEs that will post to it (shmem_uint64_put, a
 * broadcast...). Any PE posts; only the owner waits, tries, reads and frees. Flags: one of
 * SHMEMX_SEM_BOOLEAN (0 or 1: a post sets it, a wait takes it) and SHMEMX_SEM_INTEGER
 * (counts up to SHMEMX_SEM_VALUE_MAX), and optionally one producer and one consumer kind
 * (single or many; hints); 0 means INTEGER | MPRODUCER | MCONSUMER. Waits sleep after a
 * short spin (SHMEM_WAIT), so jobs of more PEs than cores move. post, wait and try each
 * imply a fence. Misuse (a freed or foreign handle, a wait on another PE's semaphore, an
 * integer semaphore posted past its maximum) ends the job with a message naming it. */
#define SHMEMX_SEM_BOOLEAN (1 << 0)
#define SHMEMX_SEM_INTEGER (1 << 1)
#define SHMEMX_SEM_SPRODUCER (1 << 2)
#define SHMEMX_SEM_MPRODUCER (1 << 3)
#define SHMEMX_SEM_SCONSUMER (1 << 4)
#define SHMEMX_SEM_MCONSUMER (1 << 5)
#define SHMEMX_SEM_VALUE_MAX 65535
#define SHMEMX_SEM_MAX 1024
typedef uint64_t shmemx_sem_t;
#define SHMEMX_SEM_NULL ((shmemx_sem_t)0)

/* A semaphore at 0 owned by this PE; SHMEMX_SEM_NULL when all SHMEMX_SEM_MAX are taken. */
shmemx_sem_t shmemx_sem_alloc(int flags);
/* Give it back (the owner; no post may be in flight to it). */
void shmemx_sem_free(shmemx_sem_t sem);
/* The PE that owns it. */
int shmemx_sem_pe(shmemx_sem_t sem);
/* Raise it by n (a boolean one: set it), from any PE: one operation to the owner that
 * wakes it, ordered after this PE's earlier puts to the owner. */
void shmemx_sem_post(shmemx_sem_t sem, size_t n);
/* Wait until it holds n, then take n (the owner). */
void shmemx_sem_wait(shmemx_sem_t sem, size_t n);
/* Take n if it holds n now: 1, else 0 (the owner). */
int shmemx_sem_try(shmemx_sem_t sem, size_t n);
/* Its value now (the owner). */
size_t shmemx_sem_value(shmemx_sem_t sem);
/* Put nbytes from source to the symmetric dest on the semaphore's owner and post n to it,
 * as one operation: whoever sees the post sees the data (bupc_memput_signal). Returns
 * when source may be reused (local completion, not delivery). */
void shmemx_putmem_signal_sem(void *dest, const void *source, size_t nbytes,
                              shmemx_sem_t sem, size_t n);
/* The same without waiting for local completion: source stays untouched until
 * shmem_quiet (bupc_memput_signal_async). */
void shmemx_putmem_signal_sem_nbi(void *dest, const void *source, size_t nbytes,
                                  shmemx_sem_t sem, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* COURIER_SHMEMX_H */
"""


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else here
    version = "0.0.0"
    with open(os.path.join(here, "..", "..", "Cargo.toml")) as f:
        for line in f:
            if line.startswith("version = "):
                version = line.split('"')[1]
                break
    files = {
        "include/shmem.h": header(version),
        "include/shmemx.h": SHMEMX,
        "src/typed/list.rs": gen_typed_list(),
    }
    for rel, text in files.items():
        path = os.path.join(out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        if rel.endswith(".rs"):
            subprocess.run(["rustfmt", "--edition", "2024", path], check=True)


if __name__ == "__main__":
    main()
