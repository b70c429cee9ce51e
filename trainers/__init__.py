"""trainers: execute a budgetplan plan with torch (RR, DP-SGD, Hybrid, WALR) and write a run record.

Importing ``trainers`` (or ``trainers.data``) does not import torch: the synthetic data
generator and the loaders run without it. The model and phase modules import torch.
"""
