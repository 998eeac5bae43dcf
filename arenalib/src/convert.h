/* Argument conversion's C (arenalib/_convert.pxi): the value of a small exact int read in place.
 * Private to arenalib._arena. */
#ifndef ARENALIB_SRC_CONVERT_H
#define ARENALIB_SRC_CONVERT_H

#include <Python.h>

/* PyLong_AsSsize_t() of an exact int, with the value of a one-digit int read in place: sizes
   and fill bytes are small, and the call was ~30 of a block's ~1,300 instructions. */
#if PY_VERSION_HEX >= 0x030C0000
static inline Py_ssize_t arenalib_long_as_ssize(PyObject *v) {
    if (PyUnstable_Long_IsCompact((PyLongObject *)v))
        return (Py_ssize_t)PyUnstable_Long_CompactValue((PyLongObject *)v);
    return PyLong_AsSsize_t(v);
}
#else
#if PY_VERSION_HEX < 0x030B0000
#include "longintrepr.h"
#endif
static inline Py_ssize_t arenalib_long_as_ssize(PyObject *v) {
    Py_ssize_t digits = Py_SIZE(v);
    if (digits == 0)
        return 0;
    if (digits == 1)
        return (Py_ssize_t)((PyLongObject *)v)->ob_digit[0];
    return PyLong_AsSsize_t(v);
}
#endif

#endif /* ARENALIB_SRC_CONVERT_H */
