/* Errors are values in graphed: every core function returns a gf_status and, on failure, fills a
 * gf_error with a sentence a user can act on. The shim turns these into TORCH_CHECK failures. */
#ifndef GF_STATUS_H
#define GF_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gf_status {
  GF_OK = 0,
  GF_ERR_INVALID_ARGUMENT, /* a value the caller passed is out of range (ValueError) */
  GF_ERR_TYPE,             /* a value of the wrong kind (TypeError) */
  GF_ERR_NO_MEMORY,        /* host allocation failed */
  GF_ERR_BACKEND,          /* the device or the framework reported a failure */
  GF_ERR_CAPTURE,          /* the capture protocol failed; the runner is now disabled */
  GF_ERR_DISABLED,         /* the runner is disabled; the call must run eager */
  GF_ERR_NOT_FOUND,        /* no such runner or entry */
  GF_ERR_FORWARD,          /* the forward raised an error of its own; the caller re-raises it */
  GF_ERR_DEVICE_MEMORY,    /* the device ran out of memory while warming up or capturing */
  GF_RUN_EAGER /* not a failure: nothing ran, the caller runs the forward eagerly itself (a new key
                * held back, when gf_call_options.eager_by_caller asks) */
} gf_status;

enum { GF_ERROR_MESSAGE_CAPACITY = 512 };

typedef struct gf_error {
  gf_status code;
  char message[GF_ERROR_MESSAGE_CAPACITY];
  /* 1 + the index of the input tensor the error is about, 0 when it is about none: the layer
   * above knows that tensor's name (a kwarg path) and its device in the framework's words, and
   * rewords the message with them. */
  size_t input_number;
} gf_error;

/* Records code and a printf-style message in err (which may be NULL), clears input_number and
 * returns code. */
gf_status gf_error_set(gf_error *err, gf_status code, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Clears err to GF_OK with an empty message. */
void gf_error_clear(gf_error *err);

/* A short stable name for a status ("invalid argument", ...). */
const char *gf_status_name(gf_status code);

#ifdef __cplusplus
}
#endif

#endif /* GF_STATUS_H */
