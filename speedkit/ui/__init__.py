"""The notebook side of speedkit: the MethodExplorer, live curves and the run board.

``speedkit.ui.plots`` and ``speedkit.ui.board`` need only plotly; the explorer needs ipywidgets
(``pip install 'torch-speedkit[notebook]'``). Nothing outside this package imports it.
"""
__all__ = ["MethodExplorer", "RunBoard", "BackgroundRun", "curves_figure"]


def __getattr__(name):
    # imported on first use, so `import speedkit.ui` works where ipywidgets is not installed
    if name == "MethodExplorer":
        from speedkit.ui.explorer import MethodExplorer
        return MethodExplorer
    if name == "RunBoard":
        from speedkit.ui.board import RunBoard
        return RunBoard
    if name == "BackgroundRun":
        from speedkit.ui.live import BackgroundRun
        return BackgroundRun
    if name == "curves_figure":
        from speedkit.ui.plots import curves_figure
        return curves_figure
    raise AttributeError(f"module 'speedkit.ui' has no attribute {name!r}")
