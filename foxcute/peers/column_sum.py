"""Column sum in plain PyTorch: the torch baseline for foxcute.column_sum."""


def column_sum(G):
    return G.sum(0)
