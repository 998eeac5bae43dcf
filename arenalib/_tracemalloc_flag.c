/* Where CPython keeps tracemalloc's "tracing" flag, for src/tracemalloc.h to read in place.
 *
 * PyTraceMalloc_Track() and PyTraceMalloc_Untrack() return at once when tracemalloc is not
 * tracing, but each is a call into the interpreter: one of each per NumPy array made in an arena
 * scope was 3-5 ns of a np.empty(8)'s 90 (bench/numpy_scope.py).  Reading the flag they read first
 * costs a load.  This is the one file of arenalib that sees CPython's internal headers (they need
 * Py_BUILD_CORE, which changes what Python.h declares, hence a file of its own); the flag's place is
 * known for 3.10-3.13, and any other version asks CPython every time. */
#define Py_BUILD_CORE_MODULE 1
#include <Python.h>

#include "src/tracemalloc.h"

const int *arenalib_tracemalloc_flag = NULL;

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030E0000
#include "internal/pycore_runtime.h"
/* Weak: an interpreter that does not export it leaves the flag NULL, not the import failing. */
#pragma weak _PyRuntime
void arenalib_tracemalloc_flag_init(void) {
    if (&_PyRuntime != NULL)
        arenalib_tracemalloc_flag = &_PyRuntime.tracemalloc.config.tracing;
}
#elif PY_VERSION_HEX < 0x030C0000
#include "internal/pycore_pymem.h"
#pragma weak _Py_tracemalloc_config
void arenalib_tracemalloc_flag_init(void) {
    if (&_Py_tracemalloc_config != NULL)
        arenalib_tracemalloc_flag = &_Py_tracemalloc_config.tracing;
}
#else
void arenalib_tracemalloc_flag_init(void) {}
#endif
