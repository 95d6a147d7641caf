// The CPython frame walk, shared by both loaders' programs: bcc's pystack.bpf.c (the layout
// compiled in as numbers) and the prebuilt CO-RE core/sampler.bpf.c (the layout read from its
// read-only config). The includer defines the PY_* layout names before including this file,
// and does the map work itself (bcc and libbpf spell map calls differently).
//
// From a thread state to the innermost frame (3.11/3.12 through the cframe, 3.10 and 3.13
// directly), then up to PY_MAX_FRAMES frames, one read of each frame's first PY_FRAME_SPAN
// bytes: code object address and instruction index per frame. The stack's id is an FNV-1a hash
// over its frames. Offsets into the frame buffer are masked so that the verifier can bound them
// where they are not compile-time numbers.

#define PY_MAX_FRAMES 32
#define PY_FRAME_SPAN_MAX 128
// Shim frames (the C stack re-entering the interpreter) are recorded with this bit set in their
// instruction index and dropped in user space: skipping them here made the loop too branchy for
// the verifier.
#define PY_SHIM_FRAME 0x80000000U

struct pystack {
    u64 code[PY_MAX_FRAMES];   // code object addresses, innermost first
    u32 instr[PY_MAX_FRAMES];  // instruction index in each code object
    u32 depth;
    u32 truncated;
};

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

struct pywalk {
    u64 hash;      // 0: no stack
    u32 failed;    // a read failed (the stack may be partial)
    u32 reached;   // the innermost frame's address was read
};

static __always_inline struct pywalk py_walk(u64 tstate, struct pystack *s) {
    struct pywalk out = {};
    u64 frame = 0;
    if (PY_FRAME_KIND == 2) {
        u64 cframe = 0;
        if (bpf_probe_read_user(&cframe, sizeof(cframe), (void *)(tstate + PY_TSTATE_FRAME)) ||
            !cframe ||
            bpf_probe_read_user(&frame, sizeof(frame), (void *)(cframe + PY_CFRAME_CURRENT))) {
            out.failed = 1;
            return out;
        }
    } else if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(tstate + PY_TSTATE_FRAME))) {
        out.failed = 1;
        return out;
    }
    out.reached = 1;
    u8 buf[PY_FRAME_SPAN_MAX];
    u32 span = PY_FRAME_SPAN;
    if (span > PY_FRAME_SPAN_MAX)
        span = PY_FRAME_SPAN_MAX;
    u32 depth = 0;
    u64 hash = 14695981039346656037ULL;
    for (int i = 0; i < PY_MAX_FRAMES; i++) {
        if (!frame)
            break;
        // One read per frame: every field used lies within its first PY_FRAME_SPAN bytes.
        if (bpf_probe_read_user(buf, span, (void *)frame)) {
            out.failed = 1;
            break;
        }
        u64 code = *(u64 *)(buf + (PY_FRAME_CODE & (PY_FRAME_SPAN_MAX - 8)));
        u32 instr;
        if (PY_FRAME_KIND == 1) {
            instr = *(int *)(buf + (PY_FRAME_INSTR & (PY_FRAME_SPAN_MAX - 4)));
        } else {
            u64 ip = *(u64 *)(buf + (PY_FRAME_INSTR & (PY_FRAME_SPAN_MAX - 8)));
            instr = (u32)((ip - code - PY_CODE_ADAPTIVE) / 2) & ~PY_SHIM_FRAME;
        }
        if (PY_FRAME_OWNER >= 0 && PY_OWNER_CSTACK >= 0 &&
            buf[PY_FRAME_OWNER & (PY_FRAME_SPAN_MAX - 1)] == PY_OWNER_CSTACK)
            instr |= PY_SHIM_FRAME;
        s->code[i] = code;
        s->instr[i] = instr;
        hash = (hash ^ code) * 1099511628211ULL;
        hash = (hash ^ instr) * 1099511628211ULL;
        depth = i + 1;
        frame = *(u64 *)(buf + (PY_FRAME_PREVIOUS & (PY_FRAME_SPAN_MAX - 8)));
    }
    s->truncated = frame != 0 && depth == PY_MAX_FRAMES;
    s->depth = depth;
    if (depth == 0)
        return out;
    hash = (hash ^ depth) * 1099511628211ULL;
    out.hash = hash ? hash : 1;
    return out;
}
