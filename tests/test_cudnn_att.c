/* cuDNN's fused attention graphs (system.attention = cudnn, cuda/attention_cudnn.cpp) built and
 * validated by cuDNN's frontend for an H100/H200 (compute capability 9.0) without a GPU: the
 * shapes dtrain's configurations use (GPT-2 124M, tiny, the GPU check's), forward and backward,
 * bf16 and fp16, must be accepted; a head size cuDNN cannot take must be refused with its reason,
 * which shows the check is live. Running the graphs needs a GPU (scripts/gpu-check.sh). Skipped
 * where the build has no CUDA or no frontend, or cuDNN cannot be loaded. */
#include <criterion/criterion.h>
#include <string.h>

#include "dt_build.h"
#include "status.h"

#ifdef DT_HAVE_CUDA
dt_status_t dt_cudnn_att_validate(int sm, int fp16, int bwd, int B, int T, int NH, int hs); /* attention_cudnn.h */

static void skip_unless_available(void) {
  dt_status_t st = dt_cudnn_att_validate(90, 0, 0, 1, 64, 1, 64);
  if (st == DT_ERR_UNSUPPORTED) cr_skip_test("%s", dt_err_msg());
  dt_err_clear();
}

Test(cudnn_att, graphs_of_dtrains_shapes_validate_for_sm90) {
  skip_unless_available();
  static const int shapes[][4] = {{16, 1024, 12, 64}, {16, 128, 4, 64}, {4, 256, 12, 64}, {2, 1024, 25, 64}, {3, 77, 2, 128}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int fp16 = 0; fp16 < 2; fp16++)
      for (int bwd = 0; bwd < 2; bwd++) {
        const int *d = shapes[s];
        dt_status_t st = dt_cudnn_att_validate(90, fp16, bwd, d[0], d[1], d[2], d[3]);
        cr_expect_eq(st, DT_OK, "B=%d T=%d NH=%d hs=%d %s %s: %s", d[0], d[1], d[2], d[3], fp16 ? "fp16" : "bf16",
                     bwd ? "backward" : "forward", dt_err_msg());
        dt_err_clear();
      }
}

Test(cudnn_att, a_head_size_cudnn_cannot_take_is_refused_with_its_reason) {
  skip_unless_available();
  dt_status_t st = dt_cudnn_att_validate(90, 0, 1, 2, 64, 2, 12); /* not a multiple of 8 */
  cr_expect_neq(st, DT_OK);
  cr_expect(strstr(dt_err_msg(), "cudnn attention") != NULL, "%s", dt_err_msg());
  dt_err_clear();
}
#else
Test(cudnn_att, needs_the_cuda_build) { cr_skip_test("dtrain is built without CUDA"); }
#endif
