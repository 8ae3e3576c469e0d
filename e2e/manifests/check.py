"""Validates Basalt's Kubernetes manifests; run by e2e/check-manifests.

Three kinds of check, each printing one line per failure (file, document, object and reason):

- rendered: the chart's rendered objects (and the CRDs themselves) against Kubernetes' own schemas
  (kubernetes-validate, strict: unknown fields are errors), plus the chart's security invariants
  (no RBAC wildcards; containers non-root, read-only root filesystem, no privilege escalation, no
  capabilities);
- examples: every document of examples/*.yaml against its CRD as the API server would check it
  on create: defaults applied, the openAPIV3Schema (unknown fields rejected, as kubectl's strict
  field validation does), and the CRD's CEL rules (x-kubernetes-validations, evaluated with
  cel-python; transition rules, which use oldSelf, only run on update and are skipped);
- invalid: every document of e2e/manifests/invalid/*.yaml must be rejected by that same
  validation, with an error containing the text of the document's `# expect: ...` comment, so
  the validator cannot silently pass everything;
- monitoring: the chart's monitoring objects rendered with every monitoring.* value enabled hold
  exactly its files: the PrometheusRule's spec is the rule file, the dashboard ConfigMap's JSON
  is the dashboard, and the PodMonitor scrapes the tablet servers' pods under the job name the
  rules use.
"""

import argparse
import copy
import glob
import os
import re
import sys

import celpy
import jsonschema
import kubernetes_validate
import yaml

# Kinds that kubernetes-validate has no schema for (CRDs of other projects). Skipped by name only.
UNKNOWN_TO_KUBERNETES_VALIDATE = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self):
        self.passed += 1

    def fail(self, where, why):
        self.failed += 1
        print(f"FAIL {where}: {why}")


def documents(path):
    """(index, comment lines, object) of each non-empty YAML document of a file."""
    with open(path) as f:
        text = f.read()
    out = []
    for chunk in re.split(r"^---[ \t]*$", text, flags=re.M):
        obj = yaml.safe_load(chunk)
        if obj is None:
            continue
        comments = [line.strip()[1:].strip() for line in chunk.splitlines() if line.strip().startswith("#")]
        out.append((len(out), comments, obj))
    return out


def describe(path, index, obj):
    name = (obj.get("metadata") or {}).get("name", "?") if isinstance(obj, dict) else "?"
    kind = obj.get("kind", "?") if isinstance(obj, dict) else "?"
    shown = os.path.relpath(path)
    if shown.startswith(".."):
        shown = os.path.basename(path)
    return f"{shown}#{index} {kind}/{name}"


# --- rendered objects ------------------------------------------------------------------------


def container_security_problems(obj):
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    pod_sc = spec.get("securityContext") or {}
    problems = []
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        sc = c.get("securityContext") or {}
        name = c.get("name")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            problems.append(f"container {name}: runAsNonRoot is not true")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"container {name}: readOnlyRootFilesystem is not true")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"container {name}: allowPrivilegeEscalation is not false")
        if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
            problems.append(f"container {name}: capabilities do not drop ALL")
        if sc.get("capabilities", {}).get("add"):
            problems.append(f"container {name}: adds capabilities")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp != "RuntimeDefault":
            problems.append(f"container {name}: seccompProfile is not RuntimeDefault")
    return problems


def rbac_problems(obj):
    problems = []
    for i, rule in enumerate(obj.get("rules") or []):
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            if any("*" in v for v in rule.get(key) or []):
                problems.append(f"rule {i}: wildcard in {key}")
    return problems


def check_rendered(paths, k8s_version, report):
    for path in paths:
        for index, _, obj in documents(path):
            where = describe(path, index, obj)
            key = (obj.get("apiVersion"), obj.get("kind"))
            if key in UNKNOWN_TO_KUBERNETES_VALIDATE:
                print(f"skip {where}: {key[1]} ({key[0]}) is a CRD kind kubernetes-validate has no schema for")
                continue
            try:
                kubernetes_validate.validate(obj, k8s_version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path_ = "/".join(str(p) for p in e.path) or "(root)"
                report.fail(where, f"Kubernetes {k8s_version} schema: at {path_}: {e.message}")
                continue
            except kubernetes_validate.SchemaNotFoundError:
                report.fail(where, f"kubernetes-validate has no schema for {key[1]} ({key[0]})")
                continue
            problems = []
            if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
                problems += container_security_problems(obj)
            if obj["kind"] in ("Role", "ClusterRole"):
                problems += rbac_problems(obj)
            for p in problems:
                report.fail(where, p)
            if not problems:
                print(f"ok   {where}")
                report.ok()


# --- custom resources against their CRDs -----------------------------------------------------


def json_schema(s, root=False):
    """JSON Schema (draft 4) of a structural OpenAPI v3 schema, as the API server applies it."""
    out = {}
    for key, value in s.items():
        if key in ("properties",):
            out[key] = {k: json_schema(v) for k, v in value.items()}
        elif key in ("items", "not"):
            out[key] = json_schema(value)
        elif key == "additionalProperties":
            out[key] = json_schema(value) if isinstance(value, dict) else value
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [json_schema(v) for v in value]
        elif key.startswith("x-kubernetes-") or key in ("nullable", "default", "description", "example", "title"):
            continue
        else:
            out[key] = value
    if s.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    # Unknown fields: pruned by the API server, and rejected by kubectl's (default) strict field
    # validation. Either way a field the schema does not know is a mistake in a manifest.
    if (
        s.get("type") == "object"
        and "properties" in s
        and "additionalProperties" not in s
        and not s.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if root:
        # apiVersion, kind and metadata are validated by the API server itself, not by the CRD.
        out.setdefault("properties", {}).update(
            {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "namespace": {"type": "string"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                },
            }
        )
    if s.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = out["enum"] + [None]
        if "anyOf" in out:
            out["anyOf"] = out["anyOf"] + [{"type": "null"}]
    return out


def apply_defaults(s, value):
    """Fills in the schema's defaults, as the API server does before validating."""
    if isinstance(value, dict):
        for prop, ps in (s.get("properties") or {}).items():
            if prop not in value and "default" in ps:
                value[prop] = copy.deepcopy(ps["default"])
        for prop, v in value.items():
            if prop in (s.get("properties") or {}):
                apply_defaults(s["properties"][prop], v)
            elif isinstance(s.get("additionalProperties"), dict):
                apply_defaults(s["additionalProperties"], v)
    elif isinstance(value, list) and isinstance(s.get("items"), dict):
        for v in value:
            apply_defaults(s["items"], v)


FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("int32")
def _int32(v):
    return not isinstance(v, int) or -(2**31) <= v < 2**31


@FORMATS.checks("int64")
def _int64(v):
    return not isinstance(v, int) or -(2**63) <= v < 2**63


class Cel:
    def __init__(self):
        self.env = celpy.Environment()
        self.programs = {}

    def check(self, rule, value):
        """None if the rule holds, else why not."""
        if rule not in self.programs:
            try:
                self.programs[rule] = self.env.program(self.env.compile(rule))
            except Exception as e:  # noqa: BLE001 - any compile failure is a failed check
                self.programs[rule] = e
        program = self.programs[rule]
        if isinstance(program, Exception):
            return f"cannot compile CEL rule {rule!r}: {program}"
        try:
            result = program.evaluate({"self": celpy.json_to_cel(value)})
        except Exception as e:  # noqa: BLE001
            return f"cannot evaluate CEL rule {rule!r}: {e}"
        if isinstance(result, celpy.CELEvalError):
            return f"cannot evaluate CEL rule {rule!r}: {result}"
        return None if result is True or result == celpy.celtypes.BoolType(True) else "false"


def cel_errors(cel, s, value, path="(root)"):
    """Violations of the x-kubernetes-validations rules of a schema and its subschemas."""
    if value is None:
        return []
    errors = []
    for v in s.get("x-kubernetes-validations") or []:
        if "oldSelf" in v["rule"]:
            continue  # a transition rule: only checked on update
        why = cel.check(v["rule"], value)
        if why is not None:
            message = v.get("message") or v.get("messageExpression") or v["rule"]
            errors.append(f"at {path}: {message}" + ("" if why == "false" else f" ({why})"))
    if isinstance(value, dict):
        props = s.get("properties") or {}
        for k, item in value.items():
            if k in props:
                errors += cel_errors(cel, props[k], item, f"{path}/{k}".replace("(root)/", ""))
            elif isinstance(s.get("additionalProperties"), dict):
                errors += cel_errors(cel, s["additionalProperties"], item, f"{path}/{k}".replace("(root)/", ""))
    elif isinstance(value, list) and isinstance(s.get("items"), dict):
        for i, item in enumerate(value):
            errors += cel_errors(cel, s["items"], item, f"{path}/{i}".replace("(root)/", ""))
    return errors


def load_crds(crd_dir):
    """{(apiVersion, kind): (openAPIV3Schema, draft-4 validator)} of every served CRD version."""
    crds = {}
    for path in sorted(glob.glob(os.path.join(crd_dir, "*.yaml"))):
        for _, _, crd in documents(path):
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = version["schema"]["openAPIV3Schema"]
                validator = jsonschema.Draft4Validator(json_schema(schema, root=True), format_checker=FORMATS)
                crds[(f"{group}/{version['name']}", kind)] = (schema, validator)
    return crds


def custom_resource_errors(crds, cel, obj):
    if not isinstance(obj, dict):
        return ["not a mapping"]
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in crds:
        return [f"no CRD in crds/ for kind {key[1]} of {key[0]}"]
    schema, validator = crds[key]
    obj = copy.deepcopy(obj)
    apply_defaults(schema, obj)
    errors = []
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path))):
        path = "/".join(str(p) for p in e.path) or "(root)"
        errors.append(f"at {path}: {e.message}")
    if not errors:
        # Like the API server, CEL rules run only on an object that passed the schema.
        errors += cel_errors(cel, schema, obj)
    return errors


def check_examples(crds, cel, paths, report):
    for path in paths:
        for index, _, obj in documents(path):
            where = describe(path, index, obj)
            errors = custom_resource_errors(crds, cel, obj)
            for e in errors:
                report.fail(where, e)
            if not errors:
                print(f"ok   {where}")
                report.ok()


def check_invalid(crds, cel, paths, report):
    for path in paths:
        for index, comments, obj in documents(path):
            where = describe(path, index, obj)
            expects = [c[len("expect:"):].strip() for c in comments if c.startswith("expect:")]
            if len(expects) != 1:
                report.fail(where, "an invalid document needs exactly one '# expect: <part of the error>' comment")
                continue
            errors = custom_resource_errors(crds, cel, obj)
            if not errors:
                report.fail(where, f"accepted, but must be rejected ({expects[0]})")
            elif not any(expects[0] in e for e in errors):
                report.fail(where, f"rejected, but not for {expects[0]!r}: {'; '.join(errors)}")
            else:
                print(f"ok   {where}: rejected ({expects[0]})")
                report.ok()


# --- the chart's monitoring objects --------------------------------------------------------


def check_monitoring(rendered, rules_path, dashboard_path, report):
    import json

    objs = {obj.get("kind"): (index, obj) for index, _, obj in documents(rendered)
            if obj.get("kind") in ("PrometheusRule", "ConfigMap", "PodMonitor")}
    for kind in ("PrometheusRule", "ConfigMap", "PodMonitor"):
        if kind not in objs:
            report.fail(rendered, f"no {kind} rendered")
    if "PrometheusRule" in objs:
        index, obj = objs["PrometheusRule"]
        with open(rules_path) as f:
            rules = yaml.safe_load(f)
        if obj.get("spec") != rules:
            report.fail(describe(rendered, index, obj), f"spec is not the content of {rules_path}")
        elif set(rules) != {"groups"}:
            report.fail(rules_path, "a PrometheusRule's spec takes only `groups`")
        else:
            report.ok()
    if "ConfigMap" in objs:
        index, obj = objs["ConfigMap"]
        with open(dashboard_path) as f:
            dashboard = json.load(f)
        data = obj.get("data") or {}
        if list(data) != ["basalt.json"] or json.loads(data["basalt.json"]) != dashboard:
            report.fail(describe(rendered, index, obj), f"data is not {{basalt.json: {dashboard_path}}}")
        elif obj["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
            report.fail(describe(rendered, index, obj), "no grafana_dashboard: \"1\" label (the sidecar's default)")
        else:
            report.ok()
    if "PodMonitor" in objs:
        index, obj = objs["PodMonitor"]
        spec = obj.get("spec") or {}
        endpoint = (spec.get("podMetricsEndpoints") or [{}])[0]
        job = [r.get("replacement") for r in endpoint.get("relabelings") or [] if r.get("targetLabel") == "job"]
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if job != ["basalt-tablet-server"] or endpoint.get("port") != "http" or \
                selector.get("app.kubernetes.io/component") != "tablet-server":
            report.fail(describe(rendered, index, obj),
                        "must scrape port http of the tablet-server pods as job basalt-tablet-server")
        else:
            report.ok()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", required=True)
    parser.add_argument("--crds", required=True, help="directory of the CRD YAML files")
    parser.add_argument("--rendered", nargs="*", default=[], help="rendered chart output files")
    parser.add_argument("--examples", nargs="*", default=[], help="custom resources that must be valid")
    parser.add_argument("--invalid", nargs="*", default=[], help="custom resources that must be rejected")
    parser.add_argument("--monitoring", nargs=3, metavar=("RENDERED", "RULES", "DASHBOARD"),
                        help="the chart rendered with every monitoring.* asset, its rule file and dashboard")
    args = parser.parse_args()

    report = Report()
    crd_files = sorted(glob.glob(os.path.join(args.crds, "*.yaml")))
    print(f"== CRDs and rendered chart against Kubernetes {args.kubernetes_version} schemas")
    check_rendered(crd_files + args.rendered, args.kubernetes_version, report)
    crds = load_crds(args.crds)
    cel = Cel()
    print(f"== examples against their CRDs ({len(args.examples)} files)")
    check_examples(crds, cel, args.examples, report)
    print(f"== invalid custom resources must be rejected ({len(args.invalid)} files)")
    if not args.invalid:
        report.fail("e2e/manifests/invalid", "no invalid documents: the validator is untested")
    check_invalid(crds, cel, args.invalid, report)
    if args.monitoring:
        print("== the chart's monitoring objects hold its files")
        check_monitoring(*args.monitoring, report)
    print(f"check-manifests: {report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
