"""System speed, one script each: ``python -m bench.speed.<name>`` (throughput, datapath, dataprep, fsdp,
elastic, operators_timing, gpu)."""
