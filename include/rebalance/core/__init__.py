"""The planning core: the model, placement, bounds, load forecasts, trigger rules,
the planners and the backtest. numpy, pandas and PuLP only: no Spark, no Airflow."""
