"""papermill's rules for parameters, restated from papermill/cli.py (_resolve_type; -y read by
PyYAML's SafeLoader without timestamps; the order -y, -p, -r) and papermill/translators.py
(PythonTranslator), with the real PyYAML and Python's own int() and float() underneath.
test_run.py and test_yaml.py compare `cellgate run`'s injected cell with papermill_cell().
"""

import math

import yaml


class NoDatesLoader(yaml.SafeLoader):
    yaml_implicit_resolvers = {
        first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def papermill_value(text):
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def papermill_str(value):
    if isinstance(value, str):
        return '"' + value.encode("unicode_escape").decode("utf-8").replace('"', '\\"') + '"'
    return '"{}"'.format(value)


def papermill_python(value):
    if value is None or isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return papermill_str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return str(value)
        return "float('nan')" if math.isnan(value) else (
            "float('-inf')" if value < 0 else "float('inf')")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{papermill_str(k)}: {papermill_python(v)}"
                               for k, v in value.items()) + "}"
    return "[" + ", ".join(papermill_python(v) for v in value) + "]"


def papermill_values(p=(), r=(), y=()):
    """The dict papermill's command line gathers from -p, -r and -y."""
    values = {}
    for text in y:
        values.update(yaml.load(text, Loader=NoDatesLoader) or {})
    for name, text in p:
        values[name] = papermill_value(text)
    for name, text in r:
        values[name] = text
    return values


def papermill_cell(p=(), r=(), y=()):
    """The source of the cell papermill injects."""
    values = papermill_values(p, r, y)
    return "# Parameters\n" + "".join(f"{k} = {papermill_python(v)}\n" for k, v in values.items())
