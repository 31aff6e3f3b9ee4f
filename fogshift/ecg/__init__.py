"""Case 2's signal processing, with no Spark and no fogshift runtime: the ECG simulator the
``ecg-source`` streams and the offline reference re-runs, the band-pass filter, and the
streaming beat classifier (features and a small neural network).

Each step is a pure function of its inputs and an explicit state, so the PEs that run it
(:mod:`fogshift.runtime.operators.ecg`) keep that state per patient in keyed state, and the
reference (:mod:`fogshift.verify.case2`) runs the same steps in one process.
"""
