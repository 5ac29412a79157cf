"""The numbers behind the teaching pages, each callable and testable without Streamlit.

:mod:`~attnviz.lessons.mechanics` (equation 1 by hand, masks, multi-head shapes, the permutation
property), :mod:`~attnviz.lessons.variants` (sparse patterns, Synthesizer, costs),
:mod:`~attnviz.lessons.positional` (section 3.5) and :mod:`~attnviz.lessons.walkthrough` (a forward
pass stage by stage). A lesson may run a model but never loads one: the page hands it the model.
"""
