/* Why this exists: the sync probe recognises a synchronizing operator by the text torch's
 * sync-debug mode "warn" starts its warning with (c10/cuda/CUDAFunctions.cpp,
 * warn_or_error_on_sync), in two places: the CUDA backend's C++ warning handler, for operators
 * called from C++, and graphed's Python layer, for operators called from Python (torch's Python
 * bindings report those to Python's warnings). One copy of the text here, usable from C and C++,
 * so that both read the same words: a torch that rewords its warning is then one change. */
#ifndef GF_SYNC_WARNING_H
#define GF_SYNC_WARNING_H

/* The start of torch's warning; the probe's failure message quotes it too ("the forward called a
 * synchronizing CUDA operation (N time(s) ...)"). */
#define GF_SYNC_WARNING "called a synchronizing CUDA operation"

#endif /* GF_SYNC_WARNING_H */
