"""The layout's rules hold: imports point down (no cycles; progressive/ never imports eval/; operators/ and
common/ import neither), methods plug in by file: each registers itself and owns its config section, and
bench/ is rooms that import only its library room, run as modules, never as paths."""

import ast
import dataclasses
import importlib
import pkgutil
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import progressive.methods as methods_pkg
from progressive.config import METHOD_OPTIONS, ConfigError, RunConfig, diff, load_config, to_dict
from progressive.methods import METHODS, Method

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("common", "operators", "progressive", "eval", "bench")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    files = {p: p.relative_to(ROOT).with_suffix("").parts for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {".".join(parts[:-1] if parts[-1] == "__init__" else parts): p for p, parts in files.items()}


def _imported(path: Path) -> list[str]:
    """Every absolute name ``path`` imports (modules and ``module.name`` of from-imports), lazy ones included."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def _import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports (anywhere in the file, lazy imports included)."""
    files = {p: p.relative_to(ROOT).with_suffix("").parts for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    mods = {".".join(parts[:-1] if parts[-1] == "__init__" else parts): p for p, parts in files.items()}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != m:
                    graph[m].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_project_modules_import_each_other_without_cycles():
    assert _cycles(_import_graph()) == []


def test_imports_point_down_progressive_never_imports_eval_and_the_base_imports_neither():
    graph = _import_graph()
    assert not [(m, d) for m, deps in graph.items() if m.startswith("progressive") for d in deps
                if d.startswith("eval")]
    low = [m for m in graph if m.startswith(("operators", "common"))]
    assert not [(m, d) for m in low for d in graph[m] if d.startswith(("progressive", "eval"))]


# progressive/'s rooms, lowest floor first: a module may import its own room and the floors below, never
# one above (docs/architecture.md draws it). The package root holds only the entry (cli.py) and __init__.
FLOORS = {"config": 0, "data": 1, "model": 2, "autocache": 2, "methods": 3, "run": 4, "pipeline": 5, "report": 6,
          "": 7}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else ""


def test_progressive_is_rooms_and_its_floors_point_down():
    loose = sorted(p.name for p in (ROOT / "progressive").glob("*.py"))
    assert loose == ["__init__.py", "cli.py"]
    rooms = sorted(p.name for p in (ROOT / "progressive").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert set(rooms) == set(FLOORS) - {""}
    graph = _import_graph()
    upward = [(m, d) for m, deps in graph.items() if m.startswith("progressive.") for d in deps
              if d.startswith("progressive.") and FLOORS[_room(d)] > FLOORS[_room(m)]]
    assert upward == []


def test_every_method_module_registers_itself_and_its_options_section():
    modules = [i.name for i in pkgutil.iter_modules(methods_pkg.__path__) if i.name not in ("base", "registry")]
    assert {"vcycle", "midas"} <= set(modules)
    registered = {cls.__module__.split(".")[2] for cls in METHODS.values()
                  if cls.__module__.startswith("progressive.methods.")}  # not a test's own
    assert set(modules) <= registered  # every module and every folder is a registered method
    for name, cls in METHODS.items():
        if cls.options is not None:
            assert METHOD_OPTIONS[name] is cls.options and dataclasses.is_dataclass(cls.options)
    cfg = RunConfig()
    assert set(cfg.method.options) == set(METHOD_OPTIONS)
    assert cfg.method.vcycle is cfg.method.options["vcycle"]


def test_method_sections_parse_into_their_dataclass_and_unknown_keys_name_the_field():
    cfg = load_config(None, {"method.name": "vcycle", "method.vcycle.depth_mode": "identity"})
    assert type(cfg.method.vcycle).__name__ == "VCycleConfig" and cfg.method.vcycle.depth_mode == "identity"
    with pytest.raises(ConfigError, match=r"method\.vcycle\.depth_modee: unknown key"):
        load_config(None, {"method.vcycle": {"depth_modee": "copy"}})
    with pytest.raises(ConfigError, match=r"method\.bogus: unknown key"):
        load_config(None, {"method": {"name": "vcycle", "bogus": {}}})
    with pytest.raises(ConfigError, match=r"method\.vcycle\.depth_mode: 'copy' or 'identity'"):
        from progressive.config import validate

        validate(load_config(None, {"method.vcycle.depth_mode": "zero"}))


def test_a_new_method_with_options_plugs_in_by_registering(tmp_path, registered_method):
    @dataclasses.dataclass
    class EchoOptions:
        k: int = 3

    class Echo(Method):
        name = "echo_layout_test"
        options = EchoOptions

    registered_method("echo_layout_test", Echo)
    p = tmp_path / "r.yaml"
    p.write_text("method: {name: echo_layout_test, echo_layout_test: {k: 7}}\n")
    cfg = load_config(p, {"method.echo_layout_test.k": "9"})
    assert cfg.method.echo_layout_test == EchoOptions(k=9)
    assert to_dict(cfg)["method"]["echo_layout_test"] == {"k": 9}


def test_resume_diff_ignores_sections_of_methods_added_since_the_run_was_saved():
    saved = to_dict(load_config(None, {"method.name": "vcycle"}))
    now = to_dict(load_config(None, {"method.name": "vcycle"}))
    now["method"]["added_later"] = {"k": 1}  # a method registered after ``saved`` was written
    assert diff(saved, now) == []
    now["method"]["vcycle"]["depth_mode"] = "identity"  # the running method's options still count
    assert diff(saved, now) == ["method.vcycle.depth_mode: 'copy' -> 'identity'"]


def test_one_list_of_families_and_every_family_is_known_to_flops_and_the_operators():
    """progressive.model.build.FAMILIES is the list of trainable families (the config names none); each one's
    checkpoint model_types have a FLOPs reader (progressive.model.flops.ARCHITECTURES), its classes a counted
    head, and the operators a parameter layout; an unknown family is one line naming model.family."""
    from operators.layouts import FAMILIES as LAYOUTS
    from progressive.config import schema
    from progressive.model import flops
    from progressive.model.build import FAMILIES, get_family

    assert not hasattr(schema, "FAMILIES")
    layout_types = {t for spec in LAYOUTS for t in spec.model_types}
    assert layout_types <= set(flops.ARCHITECTURES)  # whatever the operators transform, FLOPs can count
    for name, fam in FAMILIES.items():
        assert fam.name == name and fam.model_types
        for mt in fam.model_types:
            assert mt in flops.ARCHITECTURES and mt in layout_types, (name, mt)
        for cls in (fam.model_cls, fam.classifier_cls):
            if cls is not None:
                assert cls.__name__ in flops._HEADS, (name, cls.__name__)
    with pytest.raises(ConfigError, match=r"^model.family: unknown family 'resnet'; choose one of gpt2, llama"):
        get_family("resnet")


# bench/'s rooms: each imports the library room and its own modules, never another room; the library imports
# no room; pages/ (the generated pages, rendered from the data the other rooms record) imports only the library.
BENCH_ROOMS = {"lib", "frontier", "papers", "claims", "speed", "exactness", "pages"}


def _bench_room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in BENCH_ROOMS) else ""


def _is_script(path: Path) -> bool:
    """A module that runs as ``python -m``: a ``__main__.py`` or one with a ``__main__`` guard."""
    return path.name == "__main__.py" or 'if __name__ == "__main__":' in path.read_text()


def test_bench_is_rooms_that_import_only_the_library_room():
    bench = ROOT / "bench"
    assert sorted(p.name for p in bench.glob("*.py")) == ["__init__.py"]
    rooms = {p.name for p in bench.iterdir() if p.is_dir() and p.name not in ("__pycache__", "results")}
    assert rooms == BENCH_ROOMS
    graph = _import_graph()
    crossing = [(m, d) for m, deps in graph.items() if m.startswith("bench.") for d in deps
                if d.startswith("bench.") and _bench_room(d) not in ("lib", _bench_room(m))]
    assert crossing == []
    assert not [(m, d) for m, deps in graph.items() if _bench_room(m) == "lib" for d in deps
                if d.startswith("bench") and _bench_room(d) != "lib"]


def test_bench_scripts_never_import_each_other():
    mods = _modules()
    scripts = {m for m, p in mods.items() if m.startswith("bench") and _is_script(p)}
    assert {"bench.frontier.__main__", "bench.pages.__main__", "bench.claims.vcycle_recipes"} <= scripts
    graph = _import_graph()
    assert not [(m, d) for m, deps in graph.items() for d in deps if d in scripts]


def test_bench_runs_as_modules_without_path_edits_or_test_code_or_shadowing_names():
    tests = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"tests"}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} | {"tests"}
    for module, path in _modules().items():
        if not module.startswith("bench"):
            continue
        text = path.read_text()
        assert "sys.path" not in text, f"{module} edits sys.path: run it with python -m instead"
        assert not [n for n in _imported(path) if n.split(".")[0] in tests], f"{module} imports tests/ code"
        assert path.stem not in packages, f"{module}: its name shadows the {path.stem} package"


def test_every_method_file_is_in_the_one_list_of_methods():
    """A file in progressive/methods/ that defines a Method but is missing from the list in
    progressive/methods/__init__.py would never run and its recipe section would not parse."""

    import progressive.methods as pkg

    listed = {cls.__module__ for cls in METHODS.values()}
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"progressive.methods.{info.name}")
        defined = [v for v in vars(module).values()
                   if isinstance(v, type) and issubclass(v, Method) and v is not Method
                   and v.__module__ == module.__name__]
        assert not defined or module.__name__ in listed, f"{module.__name__} defines {defined} but is not listed"
    assert {"vcycle", "apollo", "autofreeze"} <= set(METHODS)
    assert set(METHOD_OPTIONS) >= {"vcycle", "apollo", "autofreeze"}


# ---------------------------------------------------------------------------------------------------------------
# The pages room: bench/pages/ alone renders the generated pages (the README's results block, docs/results/*.md)
# from the data in bench/results/, its prose in templates; ``python -m bench.pages --check`` covers every page.

PAGES_ROOM = "bench.pages"
RESULTS_BEGIN, RESULTS_END = "<!-- results:begin (python -m bench.pages) -->", "<!-- results:end -->"


def _page_paths(path: Path) -> list[int]:
    """Lines of ``path`` that build a path to a generated page: ``... / "docs" / "results"``, ``... / "README.md"``,
    or a string that is one ("docs/results...", "README.md")."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            left = node.left
            docs = (isinstance(left, ast.BinOp) and isinstance(left.right, ast.Constant) and left.right.value == "docs"
                    and node.right.value == "results")
            if docs or node.right.value == "README.md":
                lines.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value.startswith("docs/results") or node.value == "README.md"):
            lines.append(node.lineno)
    return lines


def test_only_the_pages_room_builds_a_path_to_a_generated_page():
    """A bench command records data; the README's results and docs/results/ are the pages room's to write (the
    papers' commands too: they record bench/results/papers_<paper>.json)."""
    found = {m: lines for m, path in _modules().items() if not m.startswith(PAGES_ROOM)
             and (lines := _page_paths(path))}
    assert found == {}, f"modules outside bench/pages/ that point at a generated page: {found}"
    assert _page_paths(ROOT / "bench" / "pages" / "text.py")  # the scan sees the room's own paths


def test_the_pages_room_keeps_its_paragraphs_in_templates():
    """No paragraph of prose in the room's Python: every string literal, an f-string's literal pieces joined
    (docstrings aside), is under 200 characters (a table cell or a clause; a paragraph goes into a template), and
    every template the code names exists."""
    from bench.pages.text import TEMPLATES

    room = ROOT / "bench" / "pages"
    for path in room.glob("*.py"):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef,
                ast.ClassDef)) and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value
            else:
                continue
            assert len(text) < 200, f"{path.name}:{node.lineno}: prose belongs in a template"
        for name in {c.args[0].value for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", "")
                     == "fill" and c.args and isinstance(c.args[0], ast.Constant)}:
            assert (TEMPLATES / f"{name}.md").is_file(), f"{path.name} fills a missing template {name}"


@pytest.fixture(scope="module")
def rendered() -> dict[Path, str]:
    from bench import pages

    return pages.render()


def test_check_covers_every_generated_page(rendered):
    """Every page in docs/results/ (the papers' pages too) and every page with a generated block (the README,
    docs/frontier.md) are rendered, so ``--check`` sees each of them."""
    generated = set((ROOT / "docs" / "results").glob("*.md"))
    assert {"multilevel.md", "apollo.md", "pipetransformer.md"} <= {p.name for p in generated}
    blocks = {p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if "(python -m bench.pages) -->" in
              p.read_text()}
    assert ROOT / "README.md" in blocks and ROOT / "docs" / "frontier.md" in blocks
    assert generated | blocks == set(rendered)
    assert {p.suffix for p in (ROOT / "docs" / "results").iterdir()} == {".md"}  # figures lie beside their data


def test_check_names_each_stale_page_and_fails(rendered, monkeypatch, capsys):
    from bench import pages

    assert pages.stale(rendered) == []
    for path in rendered:
        monkeypatch.setattr(pages, "render", lambda path=path: {**rendered, path: rendered[path] + "changed\n"})
        assert pages.main(["--check"]) == 1
        assert capsys.readouterr().err.splitlines() == [
            f"{path.relative_to(ROOT)} differs from what python -m bench.pages generates"]


def test_every_generated_readme_line_is_under_200_characters():
    text = (ROOT / "README.md").read_text()
    block = text.split(RESULTS_BEGIN, 1)[1].split(RESULTS_END, 1)[0]
    long = [(len(line), line[:60]) for line in block.splitlines() if len(line) >= 200]
    assert long == []


# ------------------------------------------------------------------ the config knows its fields
# Each config field says once what it affects (progressive/config/fields.py); the resume diff, the bench cache key,
# --name auto and the baseline look-up read that mark, and no other module lists field names for them.


def _leaf_fields(cls: type, prefix: str = "", marks: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Dotted field path -> the marks on it and on the fields that hold it, down every section (the method options'
    sections included: each registered options dataclass under ``method.<name>``)."""

    from progressive.config import METHOD_OPTIONS
    from progressive.config.schema import MethodConfig

    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, here = f"{prefix}{f.name}", marks + ((f.metadata["affects"],) if "affects" in f.metadata else ())
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or [tp]
        if tp is MethodConfig:
            out[f"{key}.name"] = here
            for name, options in METHOD_OPTIONS.items():
                out.update(_leaf_fields(options, f"{key}.{name}.", here))
        elif dataclasses.is_dataclass(inner[0]):
            out.update(_leaf_fields(inner[0], f"{key}.", here))
        else:
            out[key] = here
    return out


def test_every_config_field_has_exactly_one_mark():
    from progressive.config import MARKS

    leaves = _leaf_fields(RunConfig)
    assert {"train.lr", "data.num_proc", "name", "method.vcycle.depth_mode", "method.autofreeze.cache.enabled"} \
        <= set(leaves)
    assert [k for k, marks in leaves.items() if len(marks) != 1] == []
    assert {m for marks in leaves.values() for m in marks} <= set(MARKS)


def _lists_of_fields(path: Path, special: set[str], fields: set[str]) -> list[int]:
    """Lines of ``path`` holding a set, tuple or list literal whose strings are all config field names (dotted, or
    bare as a section lists them) and two or more of them ``special``; or a dict that reads such fields by name
    (``{"data.dataset": cfg.data.dataset, ...}``). Override dicts (name -> value) are neither."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict) and node.values and all(isinstance(v, ast.Attribute) for v in node.values):
            items = node.keys
        elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            items = node.elts
        else:
            continue
        named = [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        if len(set(named) & special) >= 2 and set(named) <= fields:
            found.append(node.lineno)
    return found


def test_no_module_but_the_config_lists_which_fields_change_nothing():
    """The old shape: RESUME_MAY_CHANGE* in the schema, _IGNORED* in the bench's run cache, a ``skip`` set in the
    command line, NOT_COMPARED beside the summary and the trainer's own list of path fields."""
    from progressive.config.schema import FIELDS, PATHS

    # the fields whose mark is not "numbers", and the path fields: dotted, and bare as a section's own list names them
    special = {k for k, f in FIELDS.items() if f.metadata["affects"] != "numbers"} | set(PATHS)
    special |= {k.rpartition(".")[2] for k in special}
    fields = set(FIELDS) | {k.rpartition(".")[2] for k in FIELDS}
    offenders = {}
    for module, path in _modules().items():
        if module.startswith(("progressive.config", "eval")):
            continue  # the schema itself; eval/ has configs of its own
        text = path.read_text()
        for old in ("RESUME_MAY_CHANGE", "_IGNORED", "NOT_COMPARED"):
            if old in text:
                offenders.setdefault(module, []).append(old)
        if lines := _lists_of_fields(path, special, fields):
            offenders.setdefault(module, []).extend(lines)
    # a paper page's shown command leaves out this machine's settings (not a question the marks answer; the
    # generated pages stay as they are)
    assert len(offenders.pop("bench.papers.core", [])) <= 1
    assert offenders == {}


def test_importing_the_config_imports_no_method_nor_torch():
    """Reading a recipe (the config package, the methods' option sections with it) needs neither the methods, numpy,
    torch nor transformers: the sections are listed in progressive/config/methods.py, and a method folder's in its
    light options.py, read through progressive/config/registry.py; no method's hooks are imported."""

    code = ("import sys, progressive.config as c; c.load_config(None, {'method.name': 'midas'}); "
            "from progressive.config.registry import FOLDERS; "
            "light = {'progressive.methods', 'progressive.config.registry', "
            "*(f'progressive.methods.{f}{o}' for f in FOLDERS for o in ('', '.options'))}; "
            "print(sorted(m for m in sys.modules if m in ('torch', 'transformers', 'numpy') or "
            "(m.startswith('progressive.methods') and m not in light)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_families_classes_are_listed_once():
    """progressive.model.flops.ARCHITECTURES is the one table of the families' classes (by model_type, with the
    heads the FLOPs count); build.py's families read theirs from it and name none, and flops holds no second table
    (a default class per model_type, a head per class)."""
    from progressive.model import flops
    from progressive.model.build import FAMILIES

    build = (ROOT / "progressive/model/build.py").read_text()
    classes = {c for a in flops.ARCHITECTURES.values() for c in a.classes}
    assert [c for c in sorted(classes) if c in build] == []
    assert "_DEFAULT_CLASS" not in (ROOT / "progressive/model/flops.py").read_text()
    for name, fam in FAMILIES.items():
        row = flops.ARCHITECTURES[name]
        assert fam.model_cls.__name__ == row.default
        assert fam.classifier_cls is None or row.classes[fam.classifier_cls.__name__] in flops.CLASSIFIES_TEXT


def test_production_code_reaches_the_fault_injector_only_through_its_seam():
    """progressive/run/faults.py is test-only: whether a run is finished is run/start.py's (``is_finished``), and
    production modules take from faults only ``armed()`` (None outside tests) and the names of its variables."""
    from progressive.run import faults, start

    taken = {name.rpartition(".")[2] for module, path in _modules().items()
             for name in _imported(path) if name.startswith("progressive.run.faults.")}
    assert taken <= {"armed", "KILL_ENV", "SIGNAL_ENV", "UNSEEN_ENV"}, taken
    assert "armed" in taken and hasattr(start, "is_finished") and not hasattr(faults, "finished_here")


# The trainer is one class holding its engine (progressive/run/engine.py): no subclass overrides half of it, its
# state is all declared in __init__, and one function sets up an optimizer and its schedule for every engine.
SOURCES = ("common", "operators", "progressive", "eval", "bench", "tests", "launch")


def _trees() -> dict[Path, ast.Module]:
    files = [p for d in SOURCES if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py")]
    return {p: ast.parse(p.read_text()) for p in [*files, *ROOT.glob("*.py")]}


def _name(node: ast.expr) -> str:
    """The last name of ``Trainer``, ``trainer.Trainer``, ``torch.optim.AdamW``..., else ''."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _subclasses_of(trees: dict[Path, ast.Module], base: str) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{c.name}" for p, tree in trees.items() for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef) and any(_name(b) == base for b in c.bases)]


def test_no_class_subclasses_the_trainer():
    """The elastic pipeline, a timed benchmark, a test: each holds or patches a ``Trainer``; none subclasses it."""
    assert _subclasses_of(_trees(), "Trainer") == []
    assert _subclasses_of({Path(ROOT / "x.py"): ast.parse("class P(LayoutLog, trainer.Trainer): pass")},
                          "Trainer") == ["x.py:P"]  # the scan sees the old shape


def _self_assigned(cls: ast.ClassDef) -> dict[str, set[str]]:
    """Attribute -> the methods of ``cls`` that assign ``self.<attribute>`` (``=``, ``+=``, annotated, unpacked,
    ``with ... as self.x``)."""
    out: dict[str, set[str]] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else
                       [node.optional_vars] if isinstance(node, ast.withitem) and node.optional_vars else [])
            while targets:
                t = targets.pop()
                if isinstance(t, (ast.Tuple, ast.List)):
                    targets += t.elts
                elif isinstance(t, ast.Starred):
                    targets.append(t.value)
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.setdefault(t.attr, set()).add(fn.name)
    return out


def _class(source: str, name: str) -> ast.ClassDef:
    return next(c for c in ast.parse(source).body if isinstance(c, ast.ClassDef) and c.name == name)


def _born_outside_init(source: str, name: str) -> list[str]:
    """The attributes first assigned outside ``__init__`` (a dataclass's fields are its ``__init__``'s)."""
    cls = _class(source, name)
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return sorted(a for a, where in _self_assigned(cls).items() if "__init__" not in where and a not in fields)


def _born_none(source: str, name: str) -> list[str]:
    """The attributes that start as None: ``self.x = None`` in ``__init__``, or a field whose default is None."""
    cls, out = _class(source, name), []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant) and node.value.value is None:
            out.append(node.target.id)
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            for n in ast.walk(node):
                value = n.value if isinstance(n, (ast.Assign, ast.AnnAssign)) else None
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
                if isinstance(value, ast.Constant) and value.value is None:
                    out += [t.attr for t in targets if isinstance(t, ast.Attribute)]
    return sorted(out)


def test_every_trainer_and_engine_attribute_is_declared_in_init():
    """A reader sees the trainer's whole state in its __init__ (and each engine's in its own): nothing is first
    set in run(), a setup or a save, so no ``getattr(self, ..., None)`` guards either."""
    for path, name in (("progressive/run/trainer.py", "Trainer"), ("progressive/run/loop.py", "TrainingRun"),
                       ("progressive/run/engine.py", "DataParallel"),
                       ("progressive/pipeline/engine.py", "PipelineEngine"),
                       ("progressive/pipeline/runtime.py", "StageRuntime"),
                       ("progressive/pipeline/logs.py", "LayoutLog")):
        source = (ROOT / path).read_text()
        assert _born_outside_init(source, name) == [], (path, name)
        assert "getattr(self," not in source, path
    assert _born_outside_init("class T:\n def __init__(self): self.a = 1\n def run(self):\n  self.a, self.b = 2, 3\n"
                              "  with x() as self.c: pass\n", "T") == ["b", "c"]  # the scan sees the old shape


def test_the_trainer_and_the_run_it_builds_start_with_no_part_missing():
    """What ``Trainer.run()`` makes (the devices, the data, the plan, the logs, the engine with its model) is built
    into one ``TrainingRun`` handed every part when it is made, and each engine is made whole, from the run's parts:
    none of them declares a part as None to fill in later (the trainer once had 12 such attributes, set by
    ``run()``; DataParallel 9 and PipelineEngine 7, set by a ``setup`` after it)."""
    for path, name in (("progressive/run/trainer.py", "Trainer"), ("progressive/run/loop.py", "TrainingRun"),
                       ("progressive/run/engine.py", "DataParallel"),
                       ("progressive/pipeline/engine.py", "PipelineEngine")):
        assert _born_none((ROOT / path).read_text(), name) == [], (path, name)
    assert _born_none("class T:\n x: int | None = None\n def __init__(self):\n  self.a: int | None = None\n"
                      "  self.b, self.c = 1, None\n", "T") == ["a", "x"]  # the scan sees the old shape


def _calls(tree: ast.Module, names: set[str]) -> list[str]:
    return [_name(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call) and _name(n.func) in names]


def test_one_function_sets_up_an_optimizer_and_its_schedule_for_every_engine():
    """AdamW and LambdaLR are constructed in progressive/run/accelerator.py only, and there the setup of a
    training optimizer (the schedule, moments carried over by name, the peak LR on resume) is one function,
    ``build_optimizer_and_scheduler``, which both engines call, once each."""
    trees = {p: t for p, t in _trees().items() if p.is_relative_to(ROOT / "progressive")}
    builder = ROOT / "progressive" / "run" / "accelerator.py"
    setup = {"AdamW", "LambdaLR", "build_scheduler", "set_peak_lr"}
    assert [(p.relative_to(ROOT), c) for p, t in trees.items() if p != builder for c in _calls(t, setup)] == []
    called = {p.relative_to(ROOT).as_posix(): len(_calls(t, {"build_optimizer_and_scheduler"}))
              for p, t in trees.items()}
    assert {p: n for p, n in called.items() if n} == {"progressive/run/engine.py": 1,
                                                      "progressive/pipeline/runtime.py": 1}
    # the load of named moments (outside a gather of FSDP2 shards) and the one AdamW are the builder's
    loads = [p.relative_to(ROOT).as_posix() for p, t in trees.items() if _calls(t, {"load_named_optimizer_state"})]
    assert sorted(loads) == ["progressive/run/accelerator.py", "progressive/run/sharding.py"]
    assert _calls(trees[builder], {"AdamW"}) == ["AdamW"]


# ---------------------------------------------------------------------------------------------------------------
# Imports at the top of a module, where readers and tools see them. A function may import a heavy dependency
# (torch, transformers, datasets, lm_eval, wandb, matplotlib, scipy...) so that a command that does not need it
# answers at once; a standard-library or project import inside a function says on its line (or the line above) why.

FIRST_PARTY = {*PACKAGES, "tests"}


def _lazy_light_imports(path: Path) -> list[str]:
    """``file:line`` of each standard-library or project import inside a function without a comment on it or on the
    line above."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for st in ast.walk(fn):
            if not isinstance(st, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(st, ast.ImportFrom) and st.level:
                top = "."
            else:
                top = (st.module if isinstance(st, ast.ImportFrom) else st.names[0].name).split(".")[0]
            light = top == "." or top in sys.stdlib_module_names or top in FIRST_PARTY
            said = "#" in "\n".join(lines[st.lineno - 1:st.end_lineno]) or lines[st.lineno - 2].lstrip().startswith("#")
            if light and not said and top != "__future__":
                found.append(f"{path.relative_to(ROOT)}:{st.lineno}")
    return found


def test_light_imports_sit_at_the_top_of_their_module():
    found = [x for path in _modules().values() for x in _lazy_light_imports(path)]
    found += _lazy_light_imports(ROOT / "train.py")
    assert found == [], f"move these imports to the module's top, or say on the line why they wait: {found}"


def test_the_scan_finds_a_light_import_inside_a_function(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "m.py").write_text("def f():\n    import json\n    from common import io\n    import torch\n\n"
                                   "def g():\n    import json  # lazy: reason\n")
    assert _lazy_light_imports(tmp_path / "m.py") == ["m.py:2", "m.py:3"]


def test_ruff_enforces_a_line_length_of_120():
    import tomllib  # noqa: I001  (the one test that reads the project file)

    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert ruff["line-length"] == 120
    assert "E" in ruff["lint"]["select"] and "E501" not in ruff["lint"].get("ignore", [])


def test_a_test_file_imports_other_tests_by_their_path_so_it_runs_alone():
    """``from test_flops import ...`` found tests/unit/model/test_flops.py only once pytest had collected that folder
    (it puts each test file's folder on sys.path): tests/unit/pipeline run alone failed to import. A test imports the
    helpers at tests/ by name, and another folder's test module by its path (``tests.unit.model.test_flops``)."""
    helpers = {p.stem for p in (ROOT / "tests").glob("*.py")}
    bare = re.compile(r"""^\s*from (test_\w+) import|__import__\(["'](test_\w+)["']\)""", re.M)
    for path in (ROOT / "tests").rglob("test_*.py"):
        for found in bare.finditer(path.read_text()):
            name = found.group(1) or found.group(2)
            assert name in helpers or (path.parent / f"{name}.py").is_file(), \
                f"{path.relative_to(ROOT)} imports {name} by its bare name: import it as tests.<its folders>.{name}"
