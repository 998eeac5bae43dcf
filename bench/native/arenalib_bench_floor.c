/* The floor under experiment 8's frame statement (bench/frames.py): the cheapest C-level objects
   that the statement `with fa() as f: f.allocate(n, zero=False).fill(3)` can run over.

   A NullArena's frame() makes a NullFrame (from a free list); its __enter__ returns it, its
   __exit__ returns False; its allocate(size, *, zero=True, align=None) makes a NullSegment (from a
   free list) of `size` bytes of one static buffer, whose fill(value) is one memset.  No checks,
   no bookkeeping, plain C with CPython's fastest calling conventions and argument handling by
   hand: what CPython itself charges for the statement (the bytecode, the with protocol's look-ups
   and bound methods, five calls, two objects made and dropped) plus the memset.  Measured in the
   same rounds as arenalib's frames, the difference is arenalib's own cost.

   Also the floor under experiment 10's small arrays (bench/numpy_scope.py): numpy_handler(), the
   cheapest NEP 49 data-memory handler that is not NumPy's own.  It keeps the one block freed last
   and hands it out again when it is big enough (glibc's malloc otherwise), with a 16-byte header in
   front as arenalib's handler has; zeroing is a memset.  No books, no liveness, no tracemalloc: what
   NumPy charges any handler of its users, so that the arena's own share is its difference. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if __has_include(<numpy/ndarraytypes.h>)  /* (meson.build passes NumPy's headers when it has them) */
#define FLOOR_NUMPY_HANDLER 1
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/ndarraytypes.h>  /* PyDataMem_Handler (the types only: no NumPy C API call) */
#endif

#define FLOOR_BUFFER (1 << 20)
#define FLOOR_FREELIST 16

static unsigned char floor_buffer[FLOOR_BUFFER];

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;
} NullSegment;

typedef struct {
    PyObject_HEAD
    PyObject *arena;
} NullFrame;

static PyTypeObject NullSegment_Type, NullFrame_Type, NullArena_Type;
static PyObject *segment_free[FLOOR_FREELIST], *frame_free[FLOOR_FREELIST];
static int segment_free_count, frame_free_count;
static PyObject *str_zero;

/* Objects from a free list (as CPython's own float and tuple free lists; with the GIL only), else
   from the heap. */
#ifdef Py_GIL_DISABLED
#define FLOOR_FREE_LISTS 0
#else
#define FLOOR_FREE_LISTS 1
#endif

static PyObject *floor_new(PyTypeObject *type, PyObject **freelist, int *count) {
    PyObject *op;
    if (FLOOR_FREE_LISTS && *count) {
        op = freelist[--*count];
        (void)PyObject_Init(op, type);
        return op;
    }
    return PyObject_New(PyObject, type);
}

static void floor_release(PyObject *op, PyObject **freelist, int *count) {
    if (FLOOR_FREE_LISTS && *count < FLOOR_FREELIST)
        freelist[(*count)++] = op;
    else
        PyObject_Free(op);
}

static PyObject *segment_fill(PyObject *self, PyObject *value) {
    long byte = PyLong_AsLong(value);
    if (byte == -1 && PyErr_Occurred())
        return NULL;
    memset(floor_buffer, (int)byte, (size_t)((NullSegment *)self)->size);
    return Py_NewRef(self);
}

static void segment_dealloc(PyObject *self) {
    floor_release(self, segment_free, &segment_free_count);
}

static PyObject *frame_enter(PyObject *self, PyObject *unused) {
    return Py_NewRef(self);
}

static PyObject *frame_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return Py_NewRef(Py_False);
}

static PyObject *frame_allocate(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs != 1 || nkw > 1 || (nkw && PyTuple_GET_ITEM(kwnames, 0) != str_zero)) {
        PyErr_SetString(PyExc_TypeError, "allocate(size, *, zero=True): the floor takes these only");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[0]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0 || size > FLOOR_BUFFER) {
        PyErr_SetString(PyExc_ValueError, "size out of the floor's buffer");
        return NULL;
    }
    NullSegment *seg = (NullSegment *)floor_new(&NullSegment_Type, segment_free, &segment_free_count);
    if (seg == NULL)
        return NULL;
    seg->size = size;
    return (PyObject *)seg;
}

static void frame_dealloc(PyObject *self) {
    Py_CLEAR(((NullFrame *)self)->arena);
    floor_release(self, frame_free, &frame_free_count);
}

static PyObject *arena_frame(PyObject *self, PyObject *unused) {
    NullFrame *frame = (NullFrame *)floor_new(&NullFrame_Type, frame_free, &frame_free_count);
    if (frame == NULL)
        return NULL;
    frame->arena = Py_NewRef(self);
    return (PyObject *)frame;
}

#ifdef FLOOR_NUMPY_HANDLER
/* -- the floor handler (NEP 49's PyDataMem_Handler, version 1) ---------------------------------- */

typedef struct {
    size_t capacity;  /* bytes after the header */
    size_t unused;    /* (keeps the data 16-byte aligned, as arenalib's header does) */
} FloorHeader;

static FloorHeader *floor_kept;  /* the block freed last: exchanged atomically (3.13t calls at once) */

static void *floor_np_malloc(void *ctx, size_t size) {
    FloorHeader *block = __atomic_exchange_n(&floor_kept, NULL, __ATOMIC_ACQUIRE);
    if (block != NULL && block->capacity < size) {
        free(block);
        block = NULL;
    }
    if (block == NULL) {
        if (size > PY_SSIZE_T_MAX - sizeof(FloorHeader))
            return NULL;
        block = malloc(sizeof(FloorHeader) + size);
        if (block == NULL)
            return NULL;
        block->capacity = size;
    }
    return block + 1;
}

static void *floor_np_calloc(void *ctx, size_t nelem, size_t elsize) {
    size_t size;
    if (__builtin_mul_overflow(nelem, elsize, &size))
        return NULL;
    void *data = floor_np_malloc(ctx, size);
    if (data != NULL)
        memset(data, 0, size);
    return data;
}

static void *floor_np_realloc(void *ctx, void *data, size_t size) {
    if (data == NULL)
        return floor_np_malloc(ctx, size);
    FloorHeader *block = (FloorHeader *)data - 1;
    if (size <= block->capacity)
        return data;
    if (size > PY_SSIZE_T_MAX - sizeof(FloorHeader))
        return NULL;
    block = realloc(block, sizeof(FloorHeader) + size);
    if (block == NULL)
        return NULL;
    block->capacity = size;
    return block + 1;
}

static void floor_np_free(void *ctx, void *data, size_t size) {
    if (data == NULL)
        return;
    FloorHeader *old = __atomic_exchange_n(&floor_kept, (FloorHeader *)data - 1, __ATOMIC_ACQ_REL);
    free(old);
}

static PyDataMem_Handler floor_handler = {
    "arenalib_bench_floor", 1,
    {NULL, floor_np_malloc, floor_np_calloc, floor_np_realloc, floor_np_free},
};

static PyObject *module_numpy_handler(PyObject *module, PyObject *unused) {
    return PyCapsule_New(&floor_handler, "mem_handler", NULL);
}
#endif

static PyMethodDef module_methods[] = {
#ifdef FLOOR_NUMPY_HANDLER
    {"numpy_handler", module_numpy_handler, METH_NOARGS,
     "a \"mem_handler\" capsule of the floor handler, for arenalib.set_numpy_handler()"},
#endif
    {NULL, NULL, 0, NULL},
};

static PyMethodDef segment_methods[] = {
    {"fill", segment_fill, METH_O, "memset of the segment's size into one buffer; returns it"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef frame_methods[] = {
    {"__enter__", frame_enter, METH_NOARGS, "returns the frame"},
    {"__exit__", (PyCFunction)(void (*)(void))frame_exit, METH_FASTCALL, "returns False"},
    {"allocate", (PyCFunction)(void (*)(void))frame_allocate, METH_FASTCALL | METH_KEYWORDS,
     "a NullSegment of size bytes"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef arena_methods[] = {
    {"frame", arena_frame, METH_NOARGS, "a NullFrame"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NullSegment_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib_bench_floor.NullSegment",
    .tp_basicsize = sizeof(NullSegment),
    .tp_dealloc = segment_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = segment_methods,
};

static PyTypeObject NullFrame_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib_bench_floor.NullFrame",
    .tp_basicsize = sizeof(NullFrame),
    .tp_dealloc = frame_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = frame_methods,
};

static PyTypeObject NullArena_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib_bench_floor.NullArena",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = arena_methods,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef floor_module = {
    PyModuleDef_HEAD_INIT, "arenalib_bench_floor",
    "The floors of experiments 8 and 10: the cheapest C-level frame statement and NumPy handler.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit_arenalib_bench_floor(void) {
    if (PyType_Ready(&NullSegment_Type) < 0 || PyType_Ready(&NullFrame_Type) < 0
            || PyType_Ready(&NullArena_Type) < 0)
        return NULL;
    str_zero = PyUnicode_InternFromString("zero");
    if (str_zero == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&floor_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "NullArena", (PyObject *)&NullArena_Type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    PyUnstable_Module_SetGIL(module, Py_MOD_GIL_NOT_USED);  /* (no free lists there) */
#endif
    return module;
}
