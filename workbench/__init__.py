"""Figures and the Gradio UI over engine/ and trees/ (no model math here)."""
