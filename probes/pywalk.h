// The CPython frame walk of process.bpf.c, kept apart so that it reads in one sitting. The
// includer defines the PY_* layout names (from its read-only config) before including this
// file, and does the map work itself.
//
// From a thread state to the innermost frame (3.11/3.12 through the cframe, 3.10 and 3.13 on
// directly), then up to PY_MAX_FRAMES frames outward: code object address and instruction index
// per frame. The stack's id is an FNV-1a hash over its frames. Offsets into the buffers are
// masked so that the verifier can bound them where they are not compile-time numbers.
//
// Frames are read a page at a time. From 3.11 a thread's frames lie next to each other in its
// data stack, the outer ones at lower addresses, so one read from the start of a frame's page
// to the end of the frame holds that frame and the callers before it in the page: a dozen or
// more frames a read instead of one (docs/results/walker-cost.md#deep-stacks). A read never
// leaves the frame's page downward, so it cannot fault where the frame itself does not. 3.10's
// frames are heap objects, read one at a time.

#define PY_MAX_FRAMES 256
#define PY_FRAME_SPAN_MAX 128
#define PY_PAGE 4096
// A power of two over a page and a frame's span: the masks below bound every offset.
#define PY_WINDOW_MAX (2 * PY_PAGE)
// Shim frames (the C stack re-entering the interpreter) are recorded with this bit set in their
// instruction index and dropped in user space: skipping them here made the loop too branchy for
// the verifier.
#define PY_SHIM_FRAME 0x80000000U

struct pystack {
    u64 code[PY_MAX_FRAMES];   // code object addresses, innermost first
    u32 instr[PY_MAX_FRAMES];  // instruction index in each code object
    u32 depth;
    u32 truncated;             // the walk stopped at PY_MAX_FRAMES with frames left
};

// What one walk works in, per CPU and per kind of program (pystack_scratch): the stack as read,
// and the bytes of the last read.
struct pyscratch {
    struct pystack stack;
    // The window read last: [base, end). Kept here rather than in locals: the verifier does
    // not follow values in map memory, so the loop's two paths (the frame in the window, or a
    // new read) meet in one state, not 2^n of them.
    u64 base;
    u64 end;
    u8 window[PY_WINDOW_MAX];
};

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

struct pywalk {
    u64 hash;      // 0: no stack
    u32 failed;    // a read failed (the stack may be partial)
    u32 reached;   // the innermost frame's address was read
};

static __always_inline struct pywalk py_walk(u64 tstate, struct pyscratch *sc) {
    struct pywalk out = {};
    struct pystack *s = &sc->stack;
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
    u32 span = PY_FRAME_SPAN;
    if (span > PY_FRAME_SPAN_MAX)
        span = PY_FRAME_SPAN_MAX;
    sc->base = 1;  // an empty window
    sc->end = 0;
    u32 depth = 0;
    u64 hash = 14695981039346656037ULL;
    for (int i = 0; i < PY_MAX_FRAMES; i++) {
        if (!frame)
            break;
        if (frame < sc->base || frame + span > sc->end) {
            u64 start = PY_FRAME_KIND == 1 ? frame : frame & ~(u64)(PY_PAGE - 1);
            // Under a page and a span: the mask changes nothing but bounds it for the verifier.
            u32 len = ((u32)(frame - start) + span) & (PY_WINDOW_MAX - 1);
            if (bpf_probe_read_user(sc->window, len, (void *)start)) {
                out.failed = 1;
                break;
            }
            sc->base = start;
            sc->end = start + len;
        }
        u8 *f = sc->window + ((u32)(frame - sc->base) & (PY_PAGE - 1));
        // 3.14's frames tag their code reference in its low bits (a _PyStackRef).
        u64 code = *(u64 *)(f + (PY_FRAME_CODE & (PY_FRAME_SPAN_MAX - 8))) & ~(u64)PY_CODE_TAG;
        u32 instr;
        if (PY_FRAME_KIND == 1) {
            instr = *(int *)(f + (PY_FRAME_INSTR & (PY_FRAME_SPAN_MAX - 4)));
        } else {
            u64 ip = *(u64 *)(f + (PY_FRAME_INSTR & (PY_FRAME_SPAN_MAX - 8)));
            instr = (u32)((ip - code - PY_CODE_ADAPTIVE) / 2) & ~PY_SHIM_FRAME;
        }
        // Frames the C stack or the interpreter owns (3.12: CSTACK; 3.14: INTERPRETER and
        // CSTACK, the highest owner values) carry no code of the program's.
        if (PY_FRAME_OWNER >= 0 && PY_OWNER_CSTACK >= 0 &&
            f[PY_FRAME_OWNER & (PY_FRAME_SPAN_MAX - 1)] >= PY_OWNER_CSTACK)
            instr |= PY_SHIM_FRAME;
        s->code[i & (PY_MAX_FRAMES - 1)] = code;
        s->instr[i & (PY_MAX_FRAMES - 1)] = instr;
        hash = (hash ^ code) * 1099511628211ULL;
        hash = (hash ^ instr) * 1099511628211ULL;
        depth = i + 1;
        frame = *(u64 *)(f + (PY_FRAME_PREVIOUS & (PY_FRAME_SPAN_MAX - 8)));
    }
    s->truncated = frame != 0 && depth == PY_MAX_FRAMES;
    s->depth = depth;
    if (depth == 0)
        return out;
    hash = (hash ^ depth) * 1099511628211ULL;
    out.hash = hash ? hash : 1;
    return out;
}
