"""The classroom: assignments made from the core (``maker.make``), graded in a sandbox by checks that name the
mistake (``grader.grade``); ``exercises`` holds the exercises and the catalogue of mistakes."""
