"""dtrain's acceptance checks (validation/) as a ReFrame test library.

    reframe -C validation/reframe/config_ci.py -c validation/reframe/dtrain_checks.py -r

One ReFrame test per check of validation/run (environment, collectives, numerics, equivalence,
model_parallel, checkpoint, cnn, bandwidth, throughput, checkpoint_io), so a centre's nightly ReFrame
run reports each on its own. The suite itself runs once, as the session fixture `dtrain_suite`:
one job with the geometry of validation/systems/SYSTEM.ini (nodes, tasks per node, CPUs per
task, GPUs per node), launching validation/run, which starts every dtrain run with srun inside
that job and writes its verdicts and measured numbers to a JSON file. Each check's test reads
its verdict (sanity) and, for the performance checks, its numbers as ReFrame performance
variables with the references of the same system file in ReFrame's own form (value, lower,
upper, unit): validation/run and ReFrame judge the same bounds.

Variables (reframe -S NAME=VALUE):
    dtrain_suite.system   validation/systems/NAME.ini (default: $DTRAIN_SYSTEM or "ci")
    dtrain_suite.checks   a comma-separated subset (default: $DTRAIN_CHECKS or all; the tests of the
                          others skip)
The partition must launch with the `local` launcher (validation/run calls srun itself) and should
use the `squeue` scheduler where Slurm has no accounting. Python standard library + ReFrame only.
"""
import configparser
import json
import math
import os

import reframe as rfm
import reframe.utility.sanity as sn
from reframe.core.builtins import fixture, parameter, run_after, run_before, sanity_function, variable

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(os.path.dirname(HERE), "run")
CHECKS = ["environment", "collectives", "numerics", "equivalence", "model_parallel", "checkpoint", "cnn",
          "bandwidth", "throughput", "checkpoint_io"]
METRICS = {"bandwidth": ["allreduce_busbw"], "throughput": ["tokens_per_s", "gflops", "scaling_efficiency"],
           "checkpoint_io": ["ckpt_write_vs_dd", "ckpt_read_vs_dd"]}


def system_file(name):
    """([system] options, [reference] entries as ReFrame tuples) of validation/systems/NAME.ini."""
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    path = os.path.join(os.path.dirname(HERE), "systems", f"{name}.ini")
    if not cp.read(path):
        raise ValueError(f"no system file {path}")
    opts = dict(cp.items("system")) if cp.has_section("system") else {}
    refs = {}
    for key, text in (cp.items("reference") if cp.has_section("reference") else []):
        value, lower, upper, unit = [x.strip() for x in text.split(",")]
        bound = lambda x: None if math.isinf(float(x)) else float(x)  # ReFrame: None = unbounded
        refs[key] = (float(value), bound(lower), bound(upper), unit)
    return opts, refs


class dtrain_suite(rfm.RunOnlyRegressionTest):
    """validation/run once in one job of the system file's geometry; results.json for the checks."""
    system = variable(str, value=os.environ.get("DTRAIN_SYSTEM", "ci"))
    checks = variable(str, value=os.environ.get("DTRAIN_CHECKS", ""))
    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    sourcesdir = None
    executable = RUN
    time_limit = "1h"

    @run_before("run")
    def geometry(self):
        opts, _ = system_file(self.system)
        per_node = int(opts.get("ntasks_per_node", 1))
        self.num_tasks = int(opts.get("nodes", 1)) * per_node
        self.num_tasks_per_node = per_node
        self.num_cpus_per_task = int(opts.get("cpus_per_task", 1))
        if int(opts.get("gpus_per_node", 0)):
            self.job.options += [f"--gpus-per-node={opts['gpus_per_node']}"]
        self.executable_opts = ["--system", self.system, "--json", "results.json", "--workdir", "work"]
        if self.checks:
            self.executable_opts += ["--checks", self.checks]

    @sanity_function
    def finished(self):
        """The suite ran to its end (the verdicts are the checks' tests' business)."""
        return sn.assert_found(r"^# failed checks: ", self.stdout)


@rfm.simple_test
class dtrain_validation(rfm.RunOnlyRegressionTest):
    """One check of validation/run: its verdict, and its numbers against the system's references."""
    check = parameter(CHECKS)
    suite = fixture(dtrain_suite, scope="session")
    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    sourcesdir = None
    local = True
    executable = "true"

    def result(self):
        with open(os.path.join(self.suite.stagedir, "results.json")) as f:
            return json.load(f).get(self.check)

    @run_after("setup")
    def selected(self):
        wanted = [c.strip() for c in self.suite.checks.split(",") if c.strip()]
        self.skip_if(wanted and self.check not in wanted, f"{self.check} not in the selected checks")

    @run_before("performance")
    def references(self):
        _, refs = system_file(self.suite.system)
        names = METRICS.get(self.check, [])
        got = (self.result() or {}).get("metrics", {})
        self.perf_variables = {m: sn.make_performance_function(sn.defer(got.get(m, float("nan"))),
                                                                refs[m][3] if m in refs else "") for m in names}
        self.reference = {"*": {m: refs[m] for m in names if m in refs}}

    @sanity_function
    def verdict(self):
        r = self.result()
        if r is None:
            return sn.assert_true(False, msg=f"{self.check}: not in the suite's results")
        return sn.assert_true(r["verdict"] in ("PASS", "SKIP"), msg=f"{self.check}: {r['verdict']}: {r['message']}")
