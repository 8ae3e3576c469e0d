"""The fenced code blocks of README.md and docs/*.md, and which test runs each one.

``COVERAGE`` says, for every block that is not ``text``, which test of e2e/test_docs.py runs
(or, for YAML, applies and validates) it, or why no test can run it on this machine.
``test_every_block_is_run`` fails on a block no rule covers, on a rule that covers nothing,
and on an unlabelled fence, so a new snippet cannot go unrun silently; each test that runs
blocks takes them from ``assigned()`` and fails on one it does not know how to run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```[ \t]*$", re.S | re.M)
ANY_FENCE = re.compile(r"^[ \t]*(```|~~~)", re.M)

# Blocks that are not commands: diagrams, grammars, command synopses, sample output.
NOT_CODE = ("text",)


def documents() -> list[str]:
    return ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))


@dataclass(frozen=True)
class Block:
    doc: str
    index: int  # position among the document's fenced blocks
    line: int  # line of the opening fence
    lang: str
    code: str

    def commands(self) -> list[str]:
        """Its lines without comments and blank lines."""
        return [line for line in self.code.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]

    def __str__(self) -> str:
        first = (self.commands() or [""])[0]
        return f"{self.doc}:{self.line} ```{self.lang} ({first[:60]!r})"


def blocks(doc: str) -> list[Block]:
    text = (REPO / doc).read_text()
    return [Block(doc, i, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
            for i, m in enumerate(FENCE.finditer(text))]


def fence_lines(doc: str) -> int:
    """Every line that opens or closes a fence, indented or not (``FENCE`` must see them all)."""
    return len(ANY_FENCE.findall((REPO / doc).read_text()))


@dataclass(frozen=True)
class Rule:
    doc: str
    test: str | None  # the test in e2e/test_docs.py that runs the block
    how: str  # what that test does with it (or why it cannot run here)
    contains: str | None = None  # a text the block contains; None: any block of the document
    langs: tuple[str, ...] = ("sh",)
    runnable: bool = True

    def covers(self, b: Block) -> bool:
        return b.doc == self.doc and b.lang in self.langs and (
            self.contains is None or self.contains in b.code)


K8S_1_20 = ("against a real kube-apiserver 1.20.2 (e2e/k8s/harness.py) whose pods are processes "
            "(e2e/k8s/kubelet.py)")

COVERAGE: list[Rule] = [
    Rule("README.md", "test_readme", "run verbatim, in order, against the server it starts",
         langs=("sh", "python")),
    Rule("docs/user-guide.md", "test_user_guide", "run verbatim, in order, against the server it starts",
         langs=("sh", "python")),
    Rule("docs/helm.md", "test_helm_md",
         "run in order " + K8S_1_20 + "; as written they fail on 1.20 for the chart's 1.25 minimum "
         "only (asserted), then they run verbatim with the chart minus its kubeVersion and CEL rules"),
    Rule("docs/operator.md", "test_operator_md",
         "applied with kubectl " + K8S_1_20 + " and reconciled by the chart's operator; also "
         "validated with the CRDs' CEL rules (test_operator_md_yaml_is_valid)", langs=("yaml",)),
    Rule("docs/operator.md", "test_operator_md",
         "run inside the cluster (Service names resolve to the pods) once the YAML blocks are Ready"),
    Rule("docs/kubernetes-e2e.md", "test_kubernetes_e2e_md_running_it",
         "run verbatim (it runs e2e/test_k8s.py again, in the background of the other doc tests)",
         contains="pytest e2e/test_k8s.py"),
    Rule("docs/kubernetes-e2e.md", "test_kubernetes_e2e_md_test_command_excerpt",
         "run verbatim, and checked to be an excerpt of e2e/run-tests", contains="export BASALT_K8S_E2E=1"),
    Rule("docs/kubernetes-e2e.md", "test_kubernetes_e2e_md_by_hand", "run verbatim",
         contains="e2e/k8s/control-plane up"),
    Rule("docs/kubernetes-e2e.md", None,
         "not runnable here: needs kind or k3d (not installed) and a Docker daemon (none) for "
         "their node containers; the images it loads are built and imported into containerd by "
         "e2e/test_images.py", contains="kind create cluster",
         runnable=False),
    Rule("docs/benchmarks.md", "test_benchmarks_md",
         "run verbatim (1,000,000 records), its server stopped with SIGTERM afterwards",
         contains="--workload load --records 1000000"),
    Rule("docs/benchmarks.md", "test_benchmarks_md",
         "run in its `# quicker:` form (the block's own shorter run: about a minute; the default "
         "form takes about two)", contains="cargo bench -p basalt-tablet-server"),
    Rule("docs/benchmarks.md", "test_benchmarks_md", "run verbatim against the first block's server",
         contains="perf record"),
    Rule("docs/monitoring.md", "test_monitoring_md", "run verbatim at the repository's top",
         contains="promtool check rules"),
    Rule("docs/monitoring.md", "test_monitoring_md",
         "checked with `promtool check config`, its relative paths made absolute (the rule file "
         "must exist; e2e/test_monitoring.py runs a real Prometheus on the same settings)",
         langs=("yaml",)),
    Rule("docs/monitoring.md", None,
         "not runnable here: needs a Kubernetes cluster with the Prometheus Operator's CRDs "
         "(PodMonitor, PrometheusRule) and Grafana's dashboard sidecar; e2e/check-manifests "
         "renders the chart with these values and checks the objects they make",
         contains="helm upgrade", runnable=False),
    # A top-level Basalt document (a scaleTargetRef's indented apiVersion does not match).
    Rule("docs/autoscaling.md", "test_autoscaling_md_yaml_is_valid",
         "each document validated against its CRD as e2e/check-manifests validates examples/*.yaml "
         "(schema, defaults, CEL rules); the autoscaled Cluster with serveNodes added, as a write "
         "through the scale subresource makes it, must be rejected",
         contains="apiVersion: basalt.dev/v1alpha1\nkind:", langs=("yaml",)),
    Rule("docs/autoscaling.md", "test_autoscaling_md_yaml_is_valid",
         "validated against Kubernetes' own schema (kubernetes-validate, strict) as e2e/check-manifests "
         "validates the chart's objects; its scaleTargetRef must be a Cluster of the page with serveNodes",
         contains="\nkind: HorizontalPodAutoscaler", langs=("yaml",)),
    Rule("docs/autoscaling.md", "test_autoscaling_md_promql",
         "each line checked with `promtool check rules` as a recording rule's expression; the first "
         "one is the query operator/src/prometheus.rs's unit test expects for the same cluster",
         langs=("promql",)),
    Rule("docs/security.md", "test_security_md_certificates",
         "run verbatim in a scratch directory; a standalone server with mutual TLS is started on "
         "the certificates it made (the next block's flags, on free ports) and the client "
         "certificate's principal, the --admin-principal, administers it over TLS",
         contains="openssl req -x509"),
    Rule("docs/security.md", "test_security_md_secured_instance",
         "run by the local runtime with a Cluster and a Table added; the runtime's certificates "
         "are where the page says", contains="kind: Instance", langs=("yaml",)),
    Rule("docs/security.md", "test_security_md_secured_instance",
         "run with DIR and the endpoint of that runtime; the channel it makes writes and reads a "
         "row as the issued admin; the Kubernetes one with a directory laid out as the identity "
         "Secret's volume (the admin's files) and that endpoint for the Service",
         contains="ssl_channel_credentials", langs=("python",)),
    Rule("docs/security.md", None,
         "not runnable here: a fragment of an Instance's spec, not a manifest; e2e/test_k8s.py::"
         "test_secured_instance_over_tls applies an Instance with it (SECURED) on a real API "
         "server and checks what the page says (TokenReview, the binding, its deletion)",
         contains="serviceAccountTokens: true", langs=("yaml",), runnable=False),
    Rule("docs/backups.md", "test_backups_md",
         "run verbatim but for SeaweedFS's ports (free ones appended as flags), in the background "
         "until the S3 endpoint answers", contains="weed mini"),
    Rule("docs/backups.md", "test_backups_md",
         "its exports set for the server (the S3 endpoint's port made the free one) and the server "
         "command started as written, then the Python block runs against it",
         contains="--backup-url"),
    Rule("docs/backups.md", "test_backups_md", "run verbatim against the previous block's server",
         contains="copy_backup", langs=("python",)),
    Rule("docs/backups.md", None,
         "not runnable here: it restores after a DropRowRange the page only tells of; "
         "e2e/test_point_in_time.py makes the same request (restore_table with the "
         "x-basalt-restore-time metadata) after a real one and checks the table it restores",
         contains="x-basalt-restore-time", langs=("python",), runnable=False),
    Rule("docs/backups.md", None,
         "not runnable here: a fragment of an Instance's spec, not a manifest; the operator's unit "
         "tests turn it into the servers' flags in both runtimes, and e2e/test_point_in_time_local.py "
         "runs a cluster's servers with the same setting (BASALT_LOG_BACKUP_INTERVAL_SECS)",
         contains="logBackup:", langs=("yaml",), runnable=False),
    Rule("docs/scale.md", None,
         "not runnable here: not within the doc tests' time (issue 30 keeps the scale benchmarks "
         "out of the test command: minutes and up to 2 GiB each); CI builds them (cargo clippy "
         "--all-targets) and docs/scale.md records their output", runnable=False),
    Rule("docs/autoscaling.md", None,
         "not runnable here: needs KEDA (its ScaledObject CRD, keda.sh/v1alpha1), which is not "
         "installed, and kubernetes-validate has no schema for it",
         contains="kind: ScaledObject", langs=("yaml",), runnable=False),
]


def rule_for(b: Block) -> list[Rule]:
    return [r for r in COVERAGE if r.covers(b)]


def assigned(test: str, doc: str | None = None) -> list[Block]:
    """The blocks ``COVERAGE`` gives to ``test``, in document order."""
    docs = [doc] if doc else sorted({r.doc for r in COVERAGE if r.test == test})
    return [b for d in docs for b in blocks(d) if any(r.test == test for r in rule_for(b))]
