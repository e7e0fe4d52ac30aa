/* Memory planner (plan.c): GPT-2 1.5B and 124M parameter counts and bytes against numbers worked
 * out by hand from the shapes, exact ZeRO division, tensor- and pipeline-parallel splits, the CPU
 * activation count against the tensor list of gpt2.c written out independently, the fit
 * verdict, the roofline's FLOPs and collective bytes, the size parser, and the cuDNN attention's
 * 16-bit copies. */
#include <criterion/criterion.h>
#include <math.h>

#include "dt_build.h"
#include "backend.h"
#include "gpt2.h"
#include "ops_cpu.h"
#include "plan.h"
#include "precision.h"

static dt_dims_t xl(void) { return (dt_dims_t){.L = 48, .NH = 25, .C = 1600, .V = 50257, .Vp = 50304, .T = 1024}; }
static dt_dims_t small(void) { return (dt_dims_t){.L = 12, .NH = 12, .C = 768, .V = 50257, .Vp = 50304, .T = 1024}; }

static dt_plan_in_t input(dt_dims_t d, int B, int T, int dp, int tp, int pp, int prec) {
  return (dt_plan_in_t){.d = d, .B = B, .T = T, .accum = 1, .dp = dp, .tp = tp, .pp = pp, .precision = prec,
                        .bucket_mb = 25, .threads = 1, .zero = -1, .device_mem = 80.0 * 1073741824.0};
}

static dt_plan_t P; /* large: static */

/* 1.5B: wte 50304*1600 + wpe 1024*1600 + 48 * (12 C^2 + 13 C) + 2 C, every tensor a multiple of
 * 16 floats so the arena has no alignment padding; true = minus the 47 padded vocabulary rows. */
Test(plan, gpt2_xl_params_and_bytes) {
  dt_plan_in_t in = input(xl(), 4, 1024, 8, 1, 1, DT_PREC_FP32);
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  const size_t C = 1600, arena = 50304 * C + 1024 * C + 48 * (12 * C * C + 13 * C) + 2 * C;
  cr_assert_eq(P.n_arena, arena);
  cr_assert_eq(P.n_arena, (size_t)1557686400);
  cr_assert_eq(P.n_true, arena - 47 * C);
  cr_assert(fabs((double)P.n_arena / 1.557e9 - 1) < 0.005, "padded count %zu not 1.557e9 +-0.5%%", P.n_arena);
  cr_assert(fabs((double)P.n_true / 1.5e9 - 1) < 0.05);
  /* the seed arithmetic: ~6.2 GB params, 6.2 GB grads, 12.5 GB m + v (fp32, GB = 1e9) */
  const double n = (double)arena;
  cr_assert_eq(P.z[0].params, 4 * n);
  cr_assert(fabs(P.z[0].params / 1e9 - 6.23) < 0.01);
  cr_assert_eq(P.z[0].grads, 4 * n);
  cr_assert(fabs((P.z[0].m + P.z[0].v) / 1e9 - 12.46) < 0.01);
  cr_assert_eq(P.z[0].wparams, 0, "fp32 has no separate working copy");
  /* bf16: the master stays fp32 and dtrain adds an fp32-stored working copy: 18.7 GB master + m + v */
  in.precision = DT_PREC_BF16;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  cr_assert_eq(P.z[0].wparams, 4 * n);
  cr_assert(fabs((P.z[0].params + P.z[0].m + P.z[0].v) / 1e9 - 18.69) < 0.01);
}

Test(plan, zero_stages_divide_exactly) {
  dt_plan_in_t in = input(xl(), 4, 1024, 8, 1, 1, DT_PREC_BF16);
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  const double n = 1557686400.0, s = 4 * ceil(n / 8); /* 194,710,800 floats per rank */
  cr_assert_eq(s, 4 * 194710800.0);
  /* stage 0: everything full; 1: m, v / dp; 2: + grads; 3: + params and working copy */
  cr_assert_eq(P.z[0].m, 4 * n);
  cr_assert_eq(P.z[1].m, s);
  cr_assert_eq(P.z[1].v, s);
  cr_assert_eq(P.z[1].grads, 4 * n);
  cr_assert_eq(P.z[2].grads, s);
  cr_assert_eq(P.z[2].params, 4 * n);
  cr_assert_eq(P.z[3].params, s);
  cr_assert_eq(P.z[3].wparams, s);
  /* buffers: DDP 2 buckets of MPI temporaries (2 all-reduces in flight); ZeRO 1-3 + one 25 MiB
   * staging bucket; ZeRO-3 holds the embeddings, ln_f and 2 blocks gathered (less its own part), the
   * largest being the embeddings wte + wpe = (50304 + 1024) * 1600 floats */
  cr_assert_eq(P.z[0].comm, 2 * 25.0 * 1048576);
  cr_assert_eq(P.z[1].comm, 3 * 25.0 * 1048576);
  cr_assert_eq(P.z[2].comm, 3 * 25.0 * 1048576);
  cr_assert_eq(P.group_emb, (50304.0 + 1024) * 1600);
  cr_assert_float_eq(P.z[3].gather, 4 * (P.group_emb + P.group_head + 2 * P.group_blk) * (1 - 1.0 / 8), 1);
  cr_assert_eq(P.z[2].gather, 0);
  /* totals: sum of the rows; activations do not depend on the stage. The device's sparse arenas
   * (ZeRO-2/3) hold the CPU's rows, the parameters one more block, the gradients also the embeddings' and ln_f's, one
   * bucket and 2 blocks (less the own part); the working copy (bf16 here, 4-byte storage) stays whole, except under
   * ZeRO-3, whose gathers fill it instead of the master: the master its shard, the working copy its shard, the gathered
   * groups and one more block */
  const double held = (1 - 1.0 / 8) * (4 * (P.group_emb + P.group_head + 2 * P.group_blk) + 25.0 * 1048576);
  for (int z = 0; z < 4; z++) {
    const dt_plan_zero_t *r = &P.z[z];
    double state = r->params + r->wparams + r->grads + r->m + r->v + r->gather + r->comm;
    double params_gpu = z >= 3 ? r->params + (r->params + r->gather + (1 - 1.0 / 8) * 4 * P.group_blk) : 2 * 4 * n;
    double grads_gpu = z >= 2 ? r->grads + held : 4 * n;
    double state_gpu = params_gpu + grads_gpu + r->m + r->v + r->comm;
    cr_assert_float_eq(r->total_gpu, state_gpu + r->act_gpu + r->work_gpu, 1);
    cr_assert_float_eq(r->total_cpu, state + r->act_cpu + r->work_cpu, 1);
    cr_assert_eq(r->act_gpu, P.z[0].act_gpu);
    if (z > 0) cr_assert(r->total_cpu < P.z[z - 1].total_cpu, "zero%d must need less than zero%d", z, z - 1);
  }
  for (int z = 1; z < 4; z++) cr_assert(P.z[z].total_gpu < P.z[z - 1].total_gpu, "device: zero%d vs zero%d", z, z - 1);
}

Test(plan, gpt2_124m_count) {
  dt_plan_in_t in = input(small(), 1, 64, 1, 1, 1, DT_PREC_FP32);
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  cr_assert_eq(P.n_true, (size_t)124439808);
  cr_assert_eq(P.n_arena, (size_t)124439808 + 47 * 768);
}

/* The CPU activation arena written out from gpt2.c's tensor list (all sizes here are
 * multiples of 16, so no alignment padding): per layer ln1, residual2, ln2, residual3, atty
 * (B,T,C) x5, qkv 3C, fch and fch_gelu 4C each, 4 (B,T) layernorm statistics, (B,NH,T) lse;
 * once: encoded, lnf, dres, dtmp (B,T,C), dqkv 3C, dfch 4C, logits Vp, 4 (B,T) (lnf stats,
 * losses, lse), and the attention scratch nthr * 2 * min(T, QB) * T. */
Test(plan, cpu_activations_match_the_tensor_list) {
  dt_dims_t d = small();
  const size_t B = 2, T = 64, C = 768, L = 12, bt = B * T, nthr = 3;
  size_t per = bt * (5 * C + 3 * C + 8 * C + 4) + B * d.NH * T;
  size_t once = bt * (4 * C + 3 * C + 4 * C + (size_t)d.Vp + 4) + dt_attention_scratch_floats((int)T, (int)nthr);
  size_t att_state = 0, att_scratch = 0;
  dt_cpu_attention_floats((int)B, (int)T, d.NH, (int)nthr, &att_state, &att_scratch);
  cr_assert_eq(dt_gpt2_activation_floats(&d, 1, d.L, 1, 1, (int)B, (int)T, 0, att_state, att_scratch), L * per + once);
  dt_plan_in_t in = input(d, (int)B, (int)T, 1, 1, 1, DT_PREC_FP32);
  in.threads = (int)nthr;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  cr_assert_eq(P.z[0].act_cpu, 4.0 * (L * per + once) + 2 * bt * sizeof(int));
  /* the CUDA attention keeps (B,NH,T,T) probabilities per layer and their gradient once */
  size_t att = B * d.NH * T * T;
  cr_assert_eq(dt_plan_gpu_activation_bytes(&d, (int)B, (int)T, 0, 0, 4),
               4 * (L * (per - B * d.NH * T + att) + once - dt_attention_scratch_floats((int)T, (int)nthr) + att));
  /* 16-bit storage with the flash attention: 2 bytes per activation, 4 per statistic, the rows'
   * log-sum-exp (B,NH,T) per layer and their <dout, out> (B,NH,T) once */
  const size_t rows = B * d.NH * T;
  const size_t per16 = 2 * bt * 16 * C + 4 * (4 * bt + rows), once16 = 2 * bt * (11 * C + d.Vp) + 4 * (4 * bt + rows);
  cr_assert_eq(dt_plan_gpu_activation_bytes(&d, (int)B, (int)T, 0, 1, 2), L * per16 + once16);
  /* the plan of a bf16 run with it: the working copy in 2 bytes, the activations above and the
   * products' fp32 accumulator (B T 4C floats) instead of float storage */
  in.precision = DT_PREC_BF16;
  in.flash = 1;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  const double g32 = P.z[0].total_gpu, n = P.z[0].params / 4;
  in.store16 = 1;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  cr_assert_float_eq(P.z[0].total_gpu - g32,
                     -2 * n + (double)dt_plan_gpu_activation_bytes(&d, (int)B, (int)T, 0, 1, 2) -
                         (double)dt_plan_gpu_activation_bytes(&d, (int)B, (int)T, 0, 1, 4) + 16.0 * bt * C,
                     1);
}

/* The planner's GPU count against what the model allocates on the CUDA backend itself (host code,
 * no GPU needed: the emulation's device or a real one), at sizes with and without alignment
 * padding. */
Test(plan, gpu_activations_match_the_cuda_backend) {
#ifdef DT_HAVE_CUDA
  dt_dims_t ds[2] = {small(), {.L = 3, .NH = 3, .C = 24, .V = 97, .Vp = 128, .T = 37}};
  int bts[2][2] = {{1, 64}, {3, 37}};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      int B = bts[j][0], T = bts[j][1] < ds[i].T ? bts[j][1] : ds[i].T;
      for (int flash = 0; flash < 2; flash++) {
        size_t state = 0, scratch = 0;
        dt_cuda_attention_floats(B, T, ds[i].NH, flash, &state, &scratch);
        cr_assert_eq(state, (size_t)B * ds[i].NH * T * (flash ? 1 : T));
        for (int rc = 0; rc < 2; rc++)
          for (int es = 2; es <= 4; es += 2)
            cr_assert_eq(dt_plan_gpu_activation_bytes(&ds[i], B, T, rc, flash, es),
                         dt_gpt2_activation_bytes(&ds[i], 1, ds[i].L, 1, 1, B, T, rc, state, scratch, es),
                         "dims %d, B=%d T=%d, recompute %d, flash %d, %d-byte activations", i, B, T, rc, flash, es);
      }
    }
#else
  cr_skip_test("built without CUDA");
#endif
}

/* tp = 4 on 124M: wte and the block's weights and column-parallel biases / 4; wpe, layernorms
 * and the two row-parallel biases replicated. */
/* system.attention = cudnn: flash's activations plus the 16-bit copies of one block's qkv (3),
 * out, dout (1 each) and dqkv (3): 8 values of 2 bytes per (B, T, C/tp) element, on every stage. */
Test(plan, cudnn_attention_adds_its_16_bit_copies) {
  for (int tp = 1; tp <= 2; tp++) {
    dt_plan_in_t in = input(small(), 16, 1024, 1, tp, 1, DT_PREC_BF16);
    in.flash = 1;
    cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
    const double flash = P.z[0].act_gpu, flash_rc = P.z[0].act_gpu_rc;
    in.cudnn = 1;
    cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
    const double want = 16.0 * 16 * 1024 * 768 / tp; /* 201 MB at tp = 1 */
    cr_assert_eq(P.z[0].act_gpu - flash, want, "tp %d: %.0f bytes more, want %.0f", tp, P.z[0].act_gpu - flash, want);
    cr_assert_eq(P.z[0].act_gpu_rc - flash_rc, want);
  }
}

Test(plan, tensor_parallel_split) {
  dt_plan_in_t in = input(small(), 1, 64, 1, 4, 1, DT_PREC_FP32);
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  const double C = 768, blk = (12 * C * C + 7 * C) / 4 + 6 * C;
  cr_assert_float_eq(P.stage_params[0], 50304 * C / 4 + 1024 * C + 12 * blk + 2 * C, 1e-3);
  cr_assert_eq(P.z[0].params, 4 * P.stage_params[0]);
  in.tp = 5; /* does not divide 12 heads */
  cr_assert_neq(dt_plan_compute(&P, &in), DT_OK);
}

/* pp: every stage gets >= 1 block, the blocks add up to L, and the largest stage (the reported
 * worst rank for params) is the smallest possible over all contiguous splits (brute force). */
Test(plan, pipeline_split_is_balanced) {
  dt_dims_t d = small();
  const double C = 768, emb = (50304 + 1024) * C, blk = 12 * C * C + 13 * C, head = 2 * C + 50304 * C;
  for (int pp = 2; pp <= 4; pp++) {
    dt_plan_in_t in = input(d, 1, 64, 1, 1, pp, DT_PREC_FP32);
    in.accum = 8;
    cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
    int sum = 0;
    double worst = 0;
    for (int s = 0; s < pp; s++) {
      cr_assert(P.stage_blocks[s] >= 1);
      sum += P.stage_blocks[s];
      double want = P.stage_blocks[s] * blk + (s == 0 ? emb : 0) + (s == pp - 1 ? head : 0);
      cr_assert_float_eq(P.stage_params[s], want, 1e-3, "pp=%d stage %d", pp, s);
      worst = fmax(worst, want);
    }
    cr_assert_eq(sum, 12);
    double best = INFINITY; /* brute force over the (first, last) block counts for pp <= 4 */
    for (int a = 1; a <= 10; a++)
      for (int b = 1; a + b <= 12; b++) {
        int mid = 12 - a - b;
        if ((pp == 2 && mid != 0) || (pp > 2 && mid < pp - 2)) continue;
        double m = fmax(emb + a * blk, head + b * blk);
        if (pp > 2) m = fmax(m, ceil((double)mid / (pp - 2)) * blk);
        best = fmin(best, m);
      }
    cr_assert_float_eq(worst, best, 1e-3, "pp=%d: worst stage %g, best possible %g", pp, worst, best);
  }
  dt_plan_in_t in = input(d, 1, 64, 1, 1, 13, DT_PREC_FP32);
  cr_assert_neq(dt_plan_compute(&P, &in), DT_OK, "more stages than layers");
  /* 1.5B, B=4, T=1024, pp=4: activations dominate, so the worst rank is stage 0 with 4
   * micro-batches in flight (1F1B); each micro-step still writes and reads only one's */
  in = input(xl(), 4, 1024, 1, 1, 4, DT_PREC_FP32);
  in.accum = 8;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  cr_assert_eq(P.z[0].pp_stage, 0);
  cr_assert(P.roof.act_rw < 0.5 * in.accum * 2 * P.z[0].act_gpu, "roofline counts in-flight activations as traffic");
  cr_assert(P.roof.act_rw > 0.2 * in.accum * 2 * P.z[0].act_gpu);
}

Test(plan, fit_verdict_and_roofline) {
  dt_plan_in_t in = input(xl(), 8, 1024, 8, 1, 1, DT_PREC_BF16);
  in.accum = 4;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  /* B=8: the CUDA backend's (B,NH,T,T) attention buffers alone are 48 * 8*25*1024^2 * 4 B = 40 GB */
  cr_assert(P.z[0].act_gpu > 48.0 * 8 * 25 * 1024 * 1024 * 4);
  cr_assert(P.z[3].total_gpu > in.device_mem, "B=8 must not fit 80 GiB even at zero3");
  cr_assert(P.z[3].total_gpu_rc < in.device_mem, "but would with recomputation");
  in.recompute = 1; /* and then the two columns swap */
  static dt_plan_t Q;
  cr_assert_eq(dt_plan_compute(&Q, &in), DT_OK);
  cr_assert_eq(Q.z[3].total_gpu, P.z[3].total_gpu_rc);
  cr_assert_eq(Q.z[3].total_gpu_rc, P.z[3].total_gpu);
  const double n = 1557686400.0;
  cr_assert_float_eq(P.roof.flops, dt_model_flops_per_token(&in.d, 1024) * 8 * 1024 * 4, 1e3);
  cr_assert_float_eq(P.roof.dp_bytes[0], 2.0 * 7 / 8 * 4 * n, 1);
  cr_assert_float_eq(P.roof.dp_bytes[3], 3.0 * 7 / 8 * 4 * n, 1);
  double tf, tm, tc, t = dt_plan_step_time(&P, &dt_gpu_a100, 2, &tf, &tm, &tc);
  cr_assert_float_eq(tf, P.roof.flops / 312e12, 1e-12);
  cr_assert_float_eq(tc, P.roof.dp_bytes[0] / 300e9, 1e-12, "8 GPUs: one node, NVLink");
  cr_assert_float_eq(t, fmax(tf, tm) + tc, 1e-12);
  in.dp = 1;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK);
  cr_assert_eq(P.roof.dp_bytes[0], 0);
}

Test(plan, parse_bytes) {
  cr_assert_eq(dt_plan_parse_bytes("80GiB"), 80.0 * 1073741824);
  cr_assert_eq(dt_plan_parse_bytes("80G"), 80.0 * 1073741824);
  cr_assert_eq(dt_plan_parse_bytes("80GB"), 80e9);
  cr_assert_eq(dt_plan_parse_bytes("1.5TB"), 1.5e12);
  cr_assert_eq(dt_plan_parse_bytes("8e10"), 8e10);
  cr_assert_eq(dt_plan_parse_bytes("512MiB"), 512.0 * 1048576);
  cr_assert_eq(dt_plan_parse_bytes("80 GiB"), -1);
  cr_assert_eq(dt_plan_parse_bytes("lots"), -1);
  cr_assert_eq(dt_plan_parse_bytes("-1G"), -1);
}

/* The roofline's pipeline bubble is the 1F1B schedule simulated with each stage's FLOPs: GPT-2
 * 124M (T = 128) on 2 stages, 8 micro-batches. Split by parameters (6 + 6 blocks) the last stage
 * also runs the lm_head (6 C Vp = 5.3 blocks of FLOPs): 1.39, far above the equal-stage 1 + 1/8;
 * split by compute (9 + 3 blocks) it is 1.15. The ratio 1.21 is what bench/mp_step.sh measured
 * on the CPU (6245 vs 5126 ms/step). */
Test(plan, pipeline_bubble_from_stage_flops) {
  dt_dims_t d = small();
  d.T = 128;
  dt_plan_in_t in = input(d, 1, 128, 1, 1, 2, DT_PREC_FP32);
  in.accum = 8;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK, "%s", dt_err_msg());
  cr_assert(P.stage_blocks[0] == 6 && P.stage_blocks[1] == 6);
  double by_params = P.roof.bubble;
  in.pp_balance = DT_PP_BALANCE_COMPUTE;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK, "%s", dt_err_msg());
  cr_assert(P.stage_blocks[0] == 9 && P.stage_blocks[1] == 3);
  double by_compute = P.roof.bubble;
  cr_assert(by_params > 1.38 && by_params < 1.40, "by parameters: %g", by_params);
  cr_assert(by_compute > 1.125 && by_compute < 1.16, "by compute: %g", by_compute);
  /* one stage: no bubble */
  in.pp = 1;
  cr_assert_eq(dt_plan_compute(&P, &in), DT_OK, "%s", dt_err_msg());
  cr_assert_float_eq(P.roof.bubble, 1.0, 1e-12);
}
