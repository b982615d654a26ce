"""The Gradio demo of the CapsNet service, an HTTP client of app/ (run: python -m frontend)."""
