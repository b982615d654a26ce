"""The paper's experiments, one CLI each; each writes its measured numbers to docs/results/<name>.json.

$ python -m training.experiments.multimnist   # section 6: overlapping digits, 36x36
$ python -m training.experiments.affine       # section 5.2: train on translated MNIST, test on affine
$ python -m training.experiments.ablation     # Table 1 (routing 1 vs 3, reconstruction) + appendix A
$ python -m training.experiments.fashion      # Fashion-MNIST, the QP-routing paper's Table II
$ python -m training.experiments.em_routing   # EM routing (matrix capsules) beside dynamic routing
$ python -m training.experiments.results      # docs/results.md from the JSON
"""
