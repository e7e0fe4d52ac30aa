/* Status codes and error reporting for dtrain.
 * Functions return dt_status_t; the first failure records a one-line message (with file, line
 * and rank) that the top level prints before it exits or aborts the job. */
#ifndef DT_STATUS_H
#define DT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#define DT_STATUS_LIST(X)                                  \
  X(DT_OK, "ok")                                           \
  X(DT_ERR_ARG, "bad argument")                            \
  X(DT_ERR_CONFIG, "configuration error")                  \
  X(DT_ERR_IO, "I/O error")                                \
  X(DT_ERR_DATA, "bad data")                               \
  X(DT_ERR_NOMEM, "out of memory")                         \
  X(DT_ERR_MPI, "MPI error")                               \
  X(DT_ERR_HDF5, "HDF5 error")                             \
  X(DT_ERR_CKPT, "checkpoint error")                       \
  X(DT_ERR_CUDA, "CUDA error")                             \
  X(DT_ERR_NCCL, "NCCL error")                             \
  X(DT_ERR_LAUNCH, "launch/layout error")                  \
  X(DT_ERR_UNSUPPORTED, "not supported")                   \
  X(DT_ERR_NUMERIC, "numerical error")                     \
  X(DT_ERR_INTERNAL, "internal error")

typedef enum {
#define DT_STATUS_ENUM(name, str) name,
  DT_STATUS_LIST(DT_STATUS_ENUM)
#undef DT_STATUS_ENUM
  DT_STATUS_COUNT
} dt_status_t;

const char *dt_status_str(dt_status_t st);

/* Record an error message (first one wins until dt_err_clear) and return st.
 * The message should name the file, key or rank it is about. */
dt_status_t dt_err_set(dt_status_t st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Last recorded message, "" if none. */
const char *dt_err_msg(void);
/* Where the last message was recorded ("src/x.c:12"). */
const char *dt_err_where(void);
void dt_err_clear(void);
/* Rank used in messages; set once the world rank is known (-1 = unknown). */
void dt_err_set_rank(int rank);
int dt_err_rank(void);

#define DT_ERR(st, ...) dt_err_set((st), __FILE__, __LINE__, __VA_ARGS__)
/* Propagate a failing status. */
#define DT_TRY(expr)                     \
  do {                                   \
    dt_status_t dt_try_st_ = (expr);     \
    if (dt_try_st_ != DT_OK) return dt_try_st_; \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
