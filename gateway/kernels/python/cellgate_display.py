"""cellgate's display formatters, loaded into every python kernel the gateway starts.

A model reads numbers, not pixels. Next to the PNG of a matplotlib figure the kernel displays
its data (type, title, axis labels, scales, ticks, elements with their points or values), and
next to the HTML of a pandas DataFrame its columns as lists, each under a MIME type of its own:

  application/vnd.cellgate.chart+json   E2B's chart format (@e2b/code-interpreter's ChartTypes):
                                        line, scatter, bar, pie, box_and_whisker, superchart,
                                        unknown
  application/vnd.cellgate.data+json    {column: [values]}, JSON-safe (NaN → null, dates as
                                        ISO 8601 strings)

and PIL's Image.show() displays the image (a display_data PNG) instead of looking for a viewer
program the jail does not have.

How it is loaded: the gateway writes this file into the kernel's connection dir and adds one
IPKernelApp exec_line that runs it as the module `_cellgate_display` (in sys.modules, never in
the user's namespace) and calls load_ipython_extension(). Nothing here imports matplotlib,
pandas or PIL: formatters are registered by type name (IPython imports nothing for those), and
the two patches that need a module's code (Axes.bxp keeps its statistics, PIL.ImageShow gets a
viewer) wait for that module's import through a meta-path hook that reacts to those two names
only. No formatter ever raises: IPython would print the traceback into the user's output.
"""

import math
import re
import sys

CHART_MIME = "application/vnd.cellgate.chart+json"
DATA_MIME = "application/vnd.cellgate.data+json"

# A series longer than this is sampled evenly (first and last point kept), so one huge line
# does not push the figure's bundle, PNG included, over the gateway's per-output cap.
MAX_POINTS = 5000
# A DataFrame with more cells than this gets no data representation (its HTML is truncated by
# pandas anyway).
MAX_DATA_CELLS = 100000

# Set by the E2B layer for its contexts: Image.save() to a file also displays the image, as E2B
# does. Off for everyone else: the agent API lists the saved file under "files".
display_saved_images = False

_UNIT = re.compile(r"\(([^()]*)\)\s*$")


# ---- values --------------------------------------------------------------------------------


def _number(value):
    """A finite float or int from a numpy or Python number; None for NaN, inf and the rest."""
    try:
        if isinstance(value, bool):
            return value
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, int):
            return value
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _round(value, digits=10):
    value = _number(value)
    if isinstance(value, float):
        value = round(value, digits)
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
    return value


def _text(value):
    """A user-given label, or None for matplotlib's hidden ones ("_child0", "_container1")."""
    if value is None:
        return None
    value = str(value)
    return None if value == "" or value.startswith("_") else value


def _unit(label):
    match = _UNIT.search(label or "")
    return match.group(1).strip() or None if match else None


def _sample(items):
    n = len(items)
    if n <= MAX_POINTS:
        return list(items)
    step = (n - 1) / (MAX_POINTS - 1)
    return [items[round(i * step)] for i in range(MAX_POINTS)]


# ---- matplotlib ----------------------------------------------------------------------------


def _axis_kind(axis):
    """linear/log/... as matplotlib names the scale, or datetime / categorical from the units."""
    converter = getattr(axis, "converter", None)
    if converter is None and hasattr(axis, "get_converter"):
        converter = axis.get_converter()
    module = type(converter).__module__ if converter is not None else ""
    if module.startswith("matplotlib.dates"):
        return "datetime"
    if module.startswith("matplotlib.category"):
        return "categorical"
    return axis.get_scale()


def _categories(axis):
    """For a categorical axis: position → category name."""
    units = getattr(axis, "units", None)
    mapping = getattr(units, "_mapping", None) or {}
    return {int(pos): str(name) for name, pos in mapping.items()}


def _converter(axis, kind):
    """Turns a plotted coordinate back into what the user gave: dates as ISO 8601, categories
    by name, numbers as numbers."""
    if kind == "datetime":
        from matplotlib import dates

        def to_date(value):
            try:
                return dates.num2date(float(value)).isoformat()
            except (TypeError, ValueError, OverflowError):
                return None

        return to_date
    if kind == "categorical":
        names = _categories(axis)

        def to_name(value):
            number = _number(value)
            if number is not None and float(number).is_integer() and int(number) in names:
                return names[int(number)]
            return _round(number)

        return to_name
    return _round


def _ticks(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    kind = _axis_kind(axis)
    convert = _converter(axis, kind)
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    positions = []
    labels = []
    for tick, label in zip(axis.get_majorticklocs(), axis.get_majorticklabels()):
        if lo - 1e-9 * (abs(lo) + 1) <= tick <= hi + 1e-9 * (abs(hi) + 1):
            positions.append(convert(tick))
            labels.append(label.get_text())
    return kind, positions, labels, convert


def _base(ax, kind):
    x_label = ax.get_xlabel() or None
    y_label = ax.get_ylabel() or None
    return {
        "type": kind,
        "title": ax.get_title() or None,
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
    }


def _point_chart(ax, kind, series):
    chart = _base(ax, kind)
    x_kind, x_ticks, x_labels, x_conv = _ticks(ax, "x")
    y_kind, y_ticks, y_labels, y_conv = _ticks(ax, "y")
    chart.update(
        x_scale=x_kind, x_ticks=x_ticks, x_tick_labels=x_labels,
        y_scale=y_kind, y_ticks=y_ticks, y_tick_labels=y_labels,
    )
    chart["elements"] = [
        {"label": label, "points": [[x_conv(x), y_conv(y)] for x, y in _sample(points)]}
        for label, points in series
    ]
    return chart


def _bar_chart(ax, containers):
    chart = _base(ax, "bar")
    elements = []
    for container in containers:
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        kind = _axis_kind(axis)
        convert = _converter(axis, kind)
        ticks = dict(zip((round(t, 9) for t in axis.get_majorticklocs()),
                         (l.get_text() for l in axis.get_majorticklabels())))
        group = _text(container.get_label())
        for rect in container.patches:
            if horizontal:
                center, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                center, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            label = ticks.get(round(center, 9)) or convert(center)
            elements.append({"label": label if label is None else str(label),
                             "value": _round(value), "group": group})
    chart["elements"] = elements
    return chart


def _pie_chart(ax, wedges):
    chart = {"type": "pie", "title": ax.get_title() or None}
    chart["elements"] = [
        {"label": _text(w.get_label()), "angle": _round(abs(w.theta2 - w.theta1), 3),
         "radius": _round(w.r)}
        for w in wedges
    ]
    return chart


def _box_chart(ax, records):
    chart = _base(ax, "box_and_whisker")
    elements = []
    for stats, vertical in records:
        axis = ax.xaxis if vertical else ax.yaxis
        tick_labels = [label.get_text() for label in axis.get_majorticklabels()]
        for i, s in enumerate(stats):
            label = s.get("label")
            if label is None and i < len(tick_labels):
                label = tick_labels[i]
            elements.append({
                "label": None if label is None else str(label),
                "min": _round(s.get("whislo")),
                "first_quartile": _round(s.get("q1")),
                "median": _round(s.get("med")),
                "third_quartile": _round(s.get("q3")),
                "max": _round(s.get("whishi")),
                "outliers": [_round(v) for v in s.get("fliers", [])],
            })
    chart["elements"] = elements
    return chart


def _axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    boxes = [(stats, vertical) for stats, vertical, median in ax.__dict__.get("_cellgate_bxp", [])
             if median is None or median in ax.lines]
    if boxes:
        return _box_chart(ax, boxes)
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return _pie_chart(ax, wedges)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        return _bar_chart(ax, bars)
    lines = [l for l in ax.lines if len(l.get_xydata())]
    if lines:
        return _point_chart(ax, "line", [(_text(l.get_label()), l.get_xydata()) for l in lines])
    scatters = [c for c in ax.collections
                if isinstance(c, PathCollection) and len(c.get_offsets())]
    if scatters:
        return _point_chart(ax, "scatter",
                            [(_text(c.get_label()), c.get_offsets()) for c in scatters])
    return {"type": "unknown", "title": ax.get_title() or None, "elements": []}


def figure_chart(figure):
    """E2B's chart of a matplotlib Figure; None when it has no axes (or anything fails)."""
    try:
        axes = [ax for ax in figure.get_axes()
                if ax.get_visible() and not hasattr(ax, "_colorbar")]
        if not axes:
            return None
        if len(axes) == 1:
            chart = _axes_chart(axes[0])
            if not chart.get("title") and getattr(figure, "_suptitle", None) is not None:
                chart["title"] = figure._suptitle.get_text() or None
            return chart
        suptitle = getattr(figure, "_suptitle", None)
        return {
            "type": "superchart",
            "title": suptitle.get_text() or None if suptitle is not None else None,
            "elements": [_axes_chart(ax) for ax in axes],
        }
    except Exception:  # a figure we cannot read still gets its PNG
        return None


def _record_bxp(bxp):
    """Wraps Axes.bxp (what boxplot() draws with) to keep the statistics it drew on the axes:
    the drawn lines alone do not say which is a cap and which a median."""
    def wrapper(self, bxpstats, *args, **kwargs):
        result = bxp(self, bxpstats, *args, **kwargs)
        try:
            vertical = kwargs.get("vert", args[1] if len(args) > 1 else True)
            orientation = kwargs.get("orientation")
            if orientation is not None:
                vertical = orientation == "vertical"
            medians = result.get("medians") or [None]
            stats = [dict(s) for s in bxpstats]
            self.__dict__.setdefault("_cellgate_bxp", []).append(
                (stats, vertical is not False, medians[0]))
        except Exception:
            pass
        return result

    wrapper.__wrapped__ = bxp
    wrapper._cellgate = True
    return wrapper


def _patch_axes(module):
    axes = getattr(module, "Axes", None)
    bxp = getattr(axes, "bxp", None)
    if bxp is not None and not getattr(bxp, "_cellgate", False):
        axes.bxp = _record_bxp(bxp)


# ---- pandas --------------------------------------------------------------------------------


def dataframe_data(frame):
    """{column: [values]} of a DataFrame, JSON-safe; None when too large or unreadable."""
    try:
        if frame.size > MAX_DATA_CELLS:
            return None
        import json

        split = json.loads(frame.to_json(orient="split", date_format="iso",
                                         default_handler=str))
        columns = [str(c) for c in split["columns"]]
        rows = split["data"]
        return {name: [row[i] for row in rows] for i, name in enumerate(columns)}
    except Exception:
        return None


# ---- PIL -----------------------------------------------------------------------------------


def _display_image(image):
    try:
        from IPython.display import display

        display(image)
        return True
    except Exception:
        return False


def _patch_imageshow(module):
    """Image.show() → a display_data PNG: our viewer goes first in PIL's list."""
    if getattr(module, "_cellgate_viewer", None) is not None:
        return

    class DisplayViewer(module.Viewer):
        def show(self, image, **options):
            return 1 if _display_image(image) else 0

    module._cellgate_viewer = DisplayViewer
    module.register(DisplayViewer, order=-1)


def _patch_image(module):
    """Image.save(<file name>) also displays the image while display_saved_images is set."""
    image_class = getattr(module, "Image", None)
    save = getattr(image_class, "save", None)
    if save is None or getattr(save, "_cellgate", False):
        return

    def wrapper(self, fp, *args, **kwargs):
        result = save(self, fp, *args, **kwargs)
        if display_saved_images and (isinstance(fp, (str, bytes)) or hasattr(fp, "__fspath__")):
            _display_image(self)
        return result

    wrapper.__wrapped__ = save
    wrapper.__doc__ = save.__doc__
    wrapper._cellgate = True
    image_class.save = wrapper


# ---- lazy hooks ----------------------------------------------------------------------------

# Module name → what to do once it has been imported.
_AFTER_IMPORT = {
    "matplotlib.axes": _patch_axes,
    "PIL.ImageShow": _patch_imageshow,
    "PIL.Image": _patch_image,
}


class _Loader:
    """The real loader, then the patch. Everything else is the real loader's."""

    def __init__(self, loader, then):
        self._loader = loader
        self._then = then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception:
            pass

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _ImportHook:
    """A meta-path finder that answers for the names in _AFTER_IMPORT only: it finds their
    real spec through the other finders and wraps the loader. One dict lookup for every other
    import."""

    def find_spec(self, name, path=None, target=None):
        then = _AFTER_IMPORT.get(name)
        if then is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, then)
        return spec

    def invalidate_caches(self):
        pass


# ---- IPython -------------------------------------------------------------------------------


def _json_formatter(ip, mime, method):
    from IPython.core.formatters import JSONFormatter

    class Formatter(JSONFormatter):
        format_type = mime
        print_method = method

    formatter = Formatter(parent=ip.display_formatter)
    ip.display_formatter.formatters[mime] = formatter
    return formatter


def load_ipython_extension(ip):
    if ip is None or CHART_MIME in ip.display_formatter.formatters:
        return
    chart = _json_formatter(ip, CHART_MIME, "_repr_cellgate_chart_")
    data = _json_formatter(ip, DATA_MIME, "_repr_cellgate_data_")
    # By name: IPython imports neither module; the printer is found once the type exists.
    # FigureBase, not Figure: matplotlib_inline pops every formatter's Figure printer whenever
    # it (re)configures the inline backend; a printer on the base class is found through the
    # MRO and left alone.
    chart.for_type_by_name("matplotlib.figure", "FigureBase", figure_chart)
    data.for_type_by_name("pandas.core.frame", "DataFrame", dataframe_data)
    for name, then in _AFTER_IMPORT.items():
        module = sys.modules.get(name)
        if module is not None:
            try:
                then(module)
            except Exception:
                pass
    if not any(isinstance(f, _ImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportHook())
