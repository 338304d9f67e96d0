"""The hand-written stubs (python/kvcache/_kvcache.pyi) against the module: every exported name is declared, and every
public attribute of an exported class (methods, properties, enum members) appears in its class. No GPU needed."""

import ast
import inspect
from pathlib import Path

import kvcache

STUB = Path(kvcache.__file__).with_name("_kvcache.pyi")


def declared(body):
    """Names a stub body declares: classes, functions and assigned names."""
    names = set()
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names


def test_the_stub_declares_every_exported_name_and_class_member():
    tree = ast.parse(STUB.read_text())
    assert set(kvcache.__all__) <= declared(tree.body)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    for name in kvcache.__all__:
        exported = getattr(kvcache, name)
        if not inspect.isclass(exported) or issubclass(exported, BaseException):
            continue
        public = {member for member in dir(exported) if not member.startswith("_")}
        missing = public - declared(classes[name].body)
        assert not missing, f"{name} members missing from {STUB.name}: {sorted(missing)}"
