-- The run's commit title (first line of its message) and author name, read
-- from git at acceptance and frozen with the run (issue 41, item 7): the
-- `commit.title` and `commit.author` expressions. NULL for runs accepted
-- before (the expressions are null there).
ALTER TABLE runs ADD COLUMN commit_title TEXT;
ALTER TABLE runs ADD COLUMN commit_author TEXT;
