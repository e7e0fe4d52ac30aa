/* Test-only fault injection, for the test suite and validation/ to prove they catch failures.
 * DTRAIN_FAULT="name@rank[:step]" plants one fault on one rank (all ranks when rank is '*'),
 * from `step` on (default: at once). Never set it in production. Names in use:
 *   ckpt_kill   SIGKILL this rank in the middle of writing a checkpoint's datasets */
#ifndef DT_FAULT_H
#define DT_FAULT_H

/* 1 when DTRAIN_FAULT names `name` for this rank at this step (step < 0: any step). */
int dt_fault(const char *name, int rank, int step);

#endif
