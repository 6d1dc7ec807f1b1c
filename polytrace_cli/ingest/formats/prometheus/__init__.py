"""Inference engines' Prometheus series: scrape files and range-query exports."""
