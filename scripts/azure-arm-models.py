#!/usr/bin/env python3
"""Writes the Azure Resource Manager shapes the Azure provider's test fake is held to, as one JSON document.

Source: the installed PyPI packages azure-mgmt-compute and azure-mgmt-network (pinned in
scripts/peers/requirements.txt). Their models are classes declaring `rest_field(name=<wire name>,
visibility=[...])` with type annotations; their operations call `build_<group>_<operation>_request`
functions that hold each call's HTTP method, URL template, query parameters and default api-version.

For every operation in OPERATIONS this reads, from the packages:
  - method, path template, api-version and query parameter names: from the build function's source (the
    string assigned to `_url`, the `api-version` default it pops, its `_params["..."]` assignments) and,
    for the method, from the HttpRequest the build function returns when called;
  - the request body model: the model class in the operation method's body parameter annotation;
  - the response model: the model the operation method deserializes (`_deserialize(_models.X, ...)`);
    for a paged operation, the page is `{<items field>: [X], <next link field>: string}` with the field
    names the method's paging code reads; the packages have no class for the page, so it is written under
    the page model name given in OPERATIONS (the REST specification's name for it);
  - the error model: the model the method deserializes error answers into.

Output:
  {"models": {Name: {"properties": {wireName: Type + {"readOnly": bool, "required": bool}},
                     "discriminator"?: {"property": wireName, "mapping": {value: Name}}}},
   "operations": {OperationId: {"method", "path", "apiVersion", "query": [names], "paged": bool,
                                "request"?: Name, "response"?: Name, "item"?: Name, "error"?: Name}}}
where Type is one of {"type": "string"|"integer"|"number"|"boolean", "format"?, "enum"?, "knownValues"?},
{"type": "array", "items": Type}, {"type": "object", "additionalProperties": Type}, {"$ref": Name} or {}
(any value). An enum the model declares closed (`Literal[...]` or the enum class alone) is "enum"; an
extensible one (`Union[str, Enum]`, which the service accepts any string for) is a string with
"knownValues". A field is readOnly when its visibility is only ["read"]; required when its annotation is
not Optional. Model names are the packages' class names; a network model whose name is also a compute
model's is written `network.<Name>`.

usage: azure-arm-models.py > models.json
"""
import ast
import datetime
import enum
import inspect
import json
import re
import sys
import textwrap
import typing

import azure.mgmt.compute.models as compute_models
import azure.mgmt.compute.operations._operations as compute_ops
import azure.mgmt.network.models as network_models
import azure.mgmt.network.operations._operations as network_ops
from azure.mgmt.compute._utils import model_base as compute_base
from azure.mgmt.network._utils import model_base as network_base

# Operation id: (package, operations class, method, page model name for a paged operation).
OPERATIONS = {
    "ResourceSkus_List": ("compute", "ResourceSkusOperations", "list", "ResourceSkusResult"),
    "CommunityGalleryImageVersions_List": (
        "compute",
        "CommunityGalleryImageVersionsOperations",
        "list",
        "CommunityGalleryImageVersionList",
    ),
    "VirtualMachines_CreateOrUpdate": ("compute", "VirtualMachinesOperations", "begin_create_or_update", None),
    "VirtualMachines_Get": ("compute", "VirtualMachinesOperations", "get", None),
    "VirtualMachines_Delete": ("compute", "VirtualMachinesOperations", "begin_delete", None),
    "VirtualMachines_List": ("compute", "VirtualMachinesOperations", "list", "VirtualMachineListResult"),
    "VirtualMachines_Restart": ("compute", "VirtualMachinesOperations", "begin_restart", None),
    "Disks_Delete": ("compute", "DisksOperations", "begin_delete", None),
    "NetworkInterfaces_CreateOrUpdate": ("network", "NetworkInterfacesOperations", "begin_create_or_update", None),
    "NetworkInterfaces_Get": ("network", "NetworkInterfacesOperations", "get", None),
    "NetworkInterfaces_Delete": ("network", "NetworkInterfacesOperations", "begin_delete", None),
}

PACKAGES = {
    "compute": (compute_models, compute_ops, compute_base),
    "network": (network_models, network_ops, network_base),
}


def fail(message):
    sys.exit(f"azure-arm-models.py: {message}")


class Models:
    """The models reachable from the operations, written as they are reached."""

    def __init__(self):
        self.out = {}
        self.names = {}  # (package, class name) -> written name
        self.pending = []

    def name(self, package, cls):
        key = (package, cls.__name__)
        if key not in self.names:
            written = cls.__name__
            if package == "network" and hasattr(compute_models, cls.__name__):
                written = f"network.{cls.__name__}"
            self.names[key] = written
            self.pending.append((package, cls, written))
        return self.names[key]

    def drain(self):
        while self.pending:
            package, cls, written = self.pending.pop()
            self.out[written] = self.model(package, cls)

    def type_of(self, package, annotation):
        """The Type of an annotation, and whether it is Optional."""
        base = PACKAGES[package][2]
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is typing.Union:
            rest = [a for a in args if a is not type(None)]
            optional = len(rest) < len(args)
            if len(rest) == 1:
                return self.type_of(package, rest[0])[0], optional
            enums = [a for a in rest if isinstance(a, type) and issubclass(a, enum.Enum)]
            plain = [a for a in rest if a in (str, int, float)]
            if enums and len(plain) == 1 and len(enums) + 1 == len(rest):
                t = self.type_of(package, plain[0])[0]
                t["knownValues"] = [m.value for e in enums for m in e]
                return t, optional
            fail(f"unsupported union {annotation}")
        if origin is typing.Literal:
            values = [a.value if isinstance(a, enum.Enum) else a for a in args]
            kind = "integer" if all(isinstance(v, int) for v in values) else "string"
            return {"type": kind, "enum": values}, False
        if origin is list:
            return {"type": "array", "items": self.type_of(package, args[0])[0]}, False
        if origin is dict:
            if args[0] is not str:
                fail(f"unsupported dict key in {annotation}")
            return {"type": "object", "additionalProperties": self.type_of(package, args[1])[0]}, False
        if annotation is typing.Any:
            return {}, False
        if annotation is str:
            return {"type": "string"}, False
        if annotation is bool:
            return {"type": "boolean"}, False
        if annotation is int:
            return {"type": "integer"}, False
        if annotation is float:
            return {"type": "number"}, False
        if annotation is datetime.datetime:
            return {"type": "string", "format": "date-time"}, False
        if annotation is datetime.timedelta:
            return {"type": "string", "format": "duration"}, False
        if annotation is bytes or annotation is bytearray:
            return {"type": "string", "format": "byte"}, False
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            values = [m.value for m in annotation]
            kind = "integer" if all(isinstance(v, int) for v in values) else "string"
            return {"type": kind, "enum": values}, False
        if isinstance(annotation, type) and issubclass(annotation, base.Model):
            return {"$ref": self.name(package, annotation)}, False
        fail(f"unsupported annotation {annotation!r}")

    def model(self, package, cls):
        models, _, base = PACKAGES[package]
        hints = {}
        fields = {}
        # Base classes first, so that a subclass's redeclaration wins.
        for klass in reversed(cls.__mro__):
            if not (isinstance(klass, type) and issubclass(klass, base.Model)) or klass is base.Model:
                continue
            hints.update(typing.get_type_hints(klass, localns={"_models": models}, include_extras=False))
            for attr, value in vars(klass).items():
                if isinstance(value, base._RestField):
                    fields[attr] = value
        properties = {}
        discriminator = None
        for attr, field in fields.items():
            wire = field._rest_name_input or attr
            t, optional = self.type_of(package, hints[attr])
            t = dict(t)
            t["readOnly"] = field._visibility == ["read"]
            t["required"] = not optional
            properties[wire] = t
            if field._is_discriminator and vars(cls).get(attr) is field:
                discriminator = wire
        out = {"properties": properties}
        mapping = getattr(cls, "__mapping__", None)
        if discriminator and mapping and "__mapping__" in vars(cls):
            out["discriminator"] = {
                "property": discriminator,
                "mapping": {value: self.name(package, sub) for value, sub in sorted(mapping.items())},
            }
        return out


def method_source(cls, name):
    return inspect.getsource(getattr(cls, name))


def build_function(package, cls, method):
    ops = PACKAGES[package][1]
    source = method_source(cls, method)
    found = re.search(r"\b(build_\w+_request)\(", source)
    if not found:
        initial = re.search(r"self\.(_\w+_initial)\(", source)
        if not initial:
            fail(f"{cls.__name__}.{method}: no build function")
        found = re.search(r"\b(build_\w+_request)\(", method_source(cls, initial.group(1)))
        if not found:
            fail(f"{cls.__name__}.{initial.group(1)}: no build function")
    return getattr(ops, found.group(1))


def targets(node):
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def operation(package, class_name, method, page):
    models_module, ops, _ = PACKAGES[package]
    cls = getattr(ops, class_name)
    build = build_function(package, cls, method)
    tree = ast.parse(textwrap.dedent(inspect.getsource(build)))
    url = None
    api = None
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and any(isinstance(t, ast.Name) and t.id == "_url" for t in targets(node))
            and isinstance(node.value, ast.Constant)
        ):
            url = node.value.value
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "pop"
            and len(node.args) == 2
            and all(isinstance(a, ast.Constant) for a in node.args)
            and node.args[0].value == "api-version"
        ):
            api = node.args[1].value
    if not url or not api:
        fail(f"{build.__name__}: no URL template or api-version")
    source = inspect.getsource(build)
    query = sorted(set(re.findall(r'_params\["([^"]+)"\]', source)))
    # The HTTP method, from a request the build function makes with placeholder arguments.
    signature = inspect.signature(build)
    positional = {
        n: "x"
        for n, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY) and p.default is p.empty
    }
    http_method = build(**positional).method

    out = {
        "method": http_method,
        "path": url,
        "apiVersion": api,
        "query": query,
        "paged": page is not None,
    }
    source = method_source(cls, method)
    # The request body: the model in the method's body parameter annotation.
    params = inspect.signature(getattr(cls, method)).parameters
    for p in params.values():
        annotation = p.annotation
        if isinstance(annotation, str):
            continue
        candidates = typing.get_args(annotation) or (annotation,)
        body = [
            c for c in candidates if isinstance(c, type) and issubclass(c, PACKAGES[package][2].Model)
        ]
        if body:
            out["request"] = MODELS.name(package, body[0])
    error = re.search(r"_failsafe_deserialize\(\s*_models\.(\w+)", source)
    if not error and re.search(r"self\.(_\w+_initial)\(", source):
        initial = re.search(r"self\.(_\w+_initial)\(", source).group(1)
        error = re.search(r"_failsafe_deserialize\(\s*_models\.(\w+)", method_source(cls, initial))
    if error:
        out["error"] = MODELS.name(package, getattr(models_module, error.group(1)))
    if page is None:
        response = re.search(r"_deserialize\(\s*_models\.(\w+),\s*response\.json\(\)", source)
        if response:
            out["response"] = MODELS.name(package, getattr(models_module, response.group(1)))
        return out
    items = re.search(r'_deserialize\(\s*List\[_models\.(\w+)\],\s*deserialized\.get\("(\w+)"', source)
    next_link = re.search(r'return deserialized\.get\("(\w+)"\) or None', source)
    if not items or not next_link:
        fail(f"{class_name}.{method}: not a paged operation")
    item = MODELS.name(package, getattr(models_module, items.group(1)))
    out["item"] = item
    out["response"] = page
    MODELS.out[page] = {
        "properties": {
            items.group(2): {"type": "array", "items": {"$ref": item}, "readOnly": False, "required": True},
            next_link.group(1): {"type": "string", "readOnly": False, "required": False},
        }
    }
    return out


MODELS = Models()


def main():
    operations = {op_id: operation(*spec) for op_id, spec in OPERATIONS.items()}
    MODELS.drain()
    json.dump(
        {"models": dict(sorted(MODELS.out.items())), "operations": operations}, sys.stdout, indent=1, sort_keys=True
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
