"""``rlmesh k8s``: render a run's manifests, print the RBAC it needs, clean a run up.

    rlmesh k8s render --config configs/launcher/kubernetes.yaml --mesh gen=4 --mesh trainer=1
    rlmesh k8s render launcher.image=ghcr.io/you/rlmesh:0.1 launcher.meshes.gen.gpus=1 --mesh gen=2 --validate
    rlmesh k8s render recipe=ppo_cartpole launcher=kubernetes launcher.image=ghcr.io/you/rlmesh:0.1 --mesh pods=3
    rlmesh k8s role --namespace rl | kubectl apply -f -
    rlmesh k8s cleanup RUN --namespace rl --wait

``render`` takes the launcher settings from ``--config`` (a YAML of ``KubernetesConfig``
fields, e.g. the ``configs/launcher/kubernetes.yaml`` preset) and ``key=value`` overrides
(dotted, with or without the ``launcher.`` prefix), and the mesh sizes from ``--mesh``
(else ``launcher.meshes.<name>.replicas``). ``--validate`` sends every object to the API
server as a server-side dry run.

With ``recipe=NAME launcher=kubernetes`` (and any other recipe overrides) the settings are the
composed recipe's ``launcher`` group, exactly what ``rlmesh run`` with the same arguments would
use; the mesh sizes come from ``--mesh``, or from the recipe config's ``proc_meshes()`` when it
has one. Composing a recipe is the recipe layer's business, above this one: ``rlmesh k8s``
enters through :mod:`rlmesh.recipes.k8s`, which passes its composition in as
``recipe_settings``; called without it, ``recipe=`` is refused with that fix.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import yaml

from rlmesh.errors import ConfigError
from rlmesh.launch.kubernetes.api import KubernetesError, kubernetes_client, load_api_client
from rlmesh.launch.kubernetes.config import KubernetesConfig
from rlmesh.launch.kubernetes.manifests import render_manifests, role_manifests, to_yaml
from rlmesh.launch.kubernetes.ops import cleanup_run, dry_run_manifests

# overrides -> (launcher settings, proc meshes): a recipe composed as ``rlmesh run`` would.
RecipeSettings = Callable[[list[str]], tuple[dict[str, Any], dict[str, int]]]


def _set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ConfigError(f"launcher.{key}: {p} is not a mapping")
    d[parts[-1]] = value


def load_settings(config_path: str | None, overrides: list[str]) -> dict[str, Any]:
    """The launcher settings: the YAML file, then each ``key=value`` (values parsed as YAML)."""
    data: dict[str, Any] = {}
    if config_path:
        with open(config_path) as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{config_path}: expected a mapping of launcher settings")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: use key=value, e.g. launcher.image=ghcr.io/you/rlmesh:0.1")
        if key == "launcher":
            continue  # launcher=kubernetes selects this very group
        _set_dotted(data, key.removeprefix("launcher."), yaml.safe_load(raw) if raw else "")
    return data


def _meshes(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, sep, n = item.partition("=")
        if not sep or not n.isdigit():
            raise ConfigError(f"--mesh {item!r}: use NAME=N, e.g. --mesh gen=4")
        out[name] = int(n)
    return out


def _api(kubeconfig: str | None, context: str | None) -> Any:
    return kubernetes_client().client.CoreV1Api(load_api_client(kubeconfig or "", context or ""))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlmesh k8s", description="Kubernetes objects of rlmesh runs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="print the manifests a run would apply (YAML)")
    r.add_argument("overrides", nargs="*", help="launcher settings as key=value (launcher.image=...)")
    r.add_argument("--config", help="YAML file of launcher settings (KubernetesConfig fields)")
    r.add_argument("--mesh", action="append", default=[], metavar="NAME=N", help="a proc mesh and its size")
    r.add_argument("--controller-addr", default=None, help="address the pods dial (default a placeholder)")
    r.add_argument("--validate", action="store_true", help="server-side dry run of every object")
    r.add_argument("--role", action="store_true", help="also print the ServiceAccount/Role/RoleBinding")
    r.add_argument("--kubeconfig")
    r.add_argument("--context")
    ro = sub.add_parser("role", help="print the ServiceAccount, Role and RoleBinding the controller needs")
    ro.add_argument("--namespace", default="default")
    ro.add_argument("--service-account", default="rlmesh-controller")
    c = sub.add_parser("cleanup", help="delete every pod and Secret labelled rlmesh.io/run=RUN")
    c.add_argument("run")
    c.add_argument("--namespace", default="default")
    c.add_argument("--grace", type=int, default=0, help="pods' termination grace in seconds (default 0)")
    c.add_argument("--wait", action="store_true", help="return only when nothing of the run is left")
    c.add_argument("--kubeconfig")
    c.add_argument("--context")
    return ap


def k8s_main(argv: list[str], recipe_settings: RecipeSettings | None = None) -> int:
    """Entry point of ``rlmesh k8s``; returns the exit code (2: bad settings, 1: the API refused).

    ``recipe_settings`` composes ``recipe=...`` overrides (given by the recipe layer); without
    it only ``--config`` and ``key=value`` launcher settings are understood.
    """
    parser = _parser()
    args, rest = parser.parse_known_args(argv)  # overrides may come after options (subparsers rule out intermixed)
    extra = [r for r in rest if r.startswith("-") or "=" not in r or args.cmd != "render"]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "render":
        args.overrides = [*args.overrides, *rest]
    try:
        if args.cmd == "role":
            print(to_yaml(role_manifests(args.namespace, args.service_account)), end="")
            return 0
        if args.cmd == "cleanup":
            n = cleanup_run(_api(args.kubeconfig, args.context), args.namespace, args.run, args.grace,
                            wait_s=120 if args.wait else 0)
            print(f"run {args.run}: deleted {n['pods']} pod(s) and {n['secrets']} secret(s) in namespace "
                  f"{args.namespace}")
            return 0
        meshes = _meshes(args.mesh)
        if any(o.startswith("recipe=") for o in args.overrides):
            if args.config:
                raise ConfigError("--config and recipe= both give launcher settings; use one")
            if recipe_settings is None:
                raise ConfigError("recipe= needs the recipe layer: run it as `rlmesh k8s render recipe=...`")
            settings, recipe_meshes = recipe_settings(args.overrides)
            meshes = meshes or recipe_meshes
            if not meshes:
                raise ConfigError("this recipe does not say its proc meshes; give them with --mesh NAME=N "
                                  "(the recipes spawn one mesh named 'pods')")
        else:
            settings = load_settings(args.config, args.overrides)
        config = KubernetesConfig.from_dict(settings)
        kw = {"controller_addr": args.controller_addr} if args.controller_addr else {}
        objs = render_manifests(config, meshes or None, **kw)
        if args.validate:
            dry_run_manifests(_api(args.kubeconfig or config.kubeconfig, args.context or config.context), objs)
            print(f"# {len(objs)} object(s) accepted by the API server (server-side dry run)", file=sys.stderr)
        if args.role:
            objs = role_manifests(config.namespace) + objs
        print(to_yaml(objs), end="")
        return 0
    except ConfigError as exc:
        print(f"rlmesh k8s {args.cmd}: {exc}", file=sys.stderr)
        return 2
    except KubernetesError as exc:
        print(f"rlmesh k8s {args.cmd}: {exc}", file=sys.stderr)
        return 1
