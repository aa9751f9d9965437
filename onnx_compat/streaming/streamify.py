"""placeholder (being written)"""


def streamify(model):
    raise NotImplementedError
