"""Views of a `CostReport`, in the spirit of PopVision: rich tables for the terminal (`tables`),
a Chrome/Perfetto trace (`trace`), a self-contained HTML page (`html`), a side-by-side comparison
of two reports (`diff`), and the atomic file writes they all use (`atomic`). `metrics` computes
the figures they share. Only `tables` and `diff` need rich."""
