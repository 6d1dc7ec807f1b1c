"""SwanLab: offline run folders (`swanlog/run-*/`), their record log and their config."""
