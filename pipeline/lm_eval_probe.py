"""Run by lm-evaluation-harness's own Python (``.lmeval/bin/python``), never imported by trtpipe: for each task name
on the command line, the request kinds (``output_type``) of the tasks it names, read from lm-eval 0.4.13's task
index (lm_eval/tasks/manager.py ``TaskManager``, lm_eval/tasks/_index.py ``Kind``/``Entry``) without loading any
dataset. Prints one JSON object: ``{"version": ..., "tasks": {name: [output_type, ...] or null (unknown)},
"datasets": {name: {"path": dataset_path, "data_files": [...]}}}``.

A task without ``output_type`` gets lm_eval/config/task.py's TaskConfig default, ``generate_until``.
"""

import json
import sys


def main(argv):
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    include, names = argv[0] or None, argv[1:]
    tm = TaskManager(include_path=include)
    index = tm.task_index
    datasets = {}

    def types(name, seen):
        if name in seen:
            return set()
        seen.add(name)
        entry = index.get(name)
        if entry is None:
            return None
        if entry.kind in (Kind.TASK, Kind.PY_TASK):
            cfg = entry.cfg or {}
            kwargs = cfg.get("dataset_kwargs") or {}
            files = kwargs.get("data_files")
            files = list(files.values()) if isinstance(files, dict) else [files] if isinstance(files, str) else (files or [])
            datasets[name] = {"path": cfg.get("dataset_path"), "data_files": [str(f) for f in files]}
            return {cfg.get("output_type", "generate_until")}
        members = entry.tags if entry.kind == Kind.TAG else [
            t if isinstance(t, str) else t.get("task") for t in (entry.cfg or {}).get("task", [])]
        out = set()
        for member in members:
            if isinstance(member, list):  # a group's task: [a, b] inside a dict
                for m in member:
                    out |= types(m, seen) or set()
            elif isinstance(member, str):
                out |= types(member, seen) or set()
            elif isinstance(member, dict):  # an inline task config
                out.add(member.get("output_type", "generate_until"))
        return out

    result = {}
    for name in names:
        t = types(name, set())
        result[name] = None if t is None else sorted(t)
    print(json.dumps({"version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
                      "tasks": result, "datasets": datasets}))


if __name__ == "__main__":
    main(sys.argv[1:])
