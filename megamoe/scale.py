"""Kept only for ``megamoe.repredict``'s import of ``predict_config``; the prediction is ``megamoe.predict``."""

from .predict import predict_config

__all__ = ["predict_config"]
