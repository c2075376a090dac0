"""Method claims, one script each: ``python -m bench.claims.<name>`` (vcycle_recipes, vcycle_ablation, apollo,
autofreeze, autofreeze_epochs, autofreeze_lm)."""
