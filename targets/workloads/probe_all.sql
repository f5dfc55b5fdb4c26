-- A workload for sqlite3: tables, indexes, joins, aggregates, a recursive
-- CTE, triggers, JSON, text functions and a transaction rolled back.
.headers on
.mode list
CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, price REAL, tags TEXT);
CREATE TABLE sale(id INTEGER PRIMARY KEY, item_id INTEGER REFERENCES item(id), qty INTEGER, day INTEGER);
CREATE TABLE log(msg TEXT);
CREATE TRIGGER sale_log AFTER INSERT ON sale WHEN new.qty > 45 BEGIN INSERT INTO log VALUES ('big sale ' || new.id); END;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
INSERT INTO item SELECT i, printf('item-%05d', i), round((i * 37 % 1000) / 10.0, 2), json_array(i % 3, i % 5) FROM n;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
INSERT INTO sale SELECT i, (i * 7919) % 2000 + 1, i % 50, i % 365 FROM n;
CREATE INDEX sale_item ON sale(item_id);
CREATE INDEX item_price ON item(price);
SELECT count(*), sum(qty), min(day), max(day) FROM sale;
SELECT i.name, sum(s.qty) AS total FROM item i JOIN sale s ON s.item_id = i.id GROUP BY i.id ORDER BY total DESC, i.name LIMIT 5;
SELECT day % 7 AS weekday, round(avg(qty), 3), count(*) FROM sale GROUP BY weekday ORDER BY weekday;
SELECT name, price FROM item WHERE price BETWEEN 10 AND 10.5 ORDER BY price, name;
SELECT json_extract(tags, '$[1]') AS t, count(*) FROM item GROUP BY t ORDER BY t;
SELECT upper(substr(name, 1, 4)) || '/' || length(name), replace(name, '-', '_') FROM item WHERE id IN (1, 999, 2000);
SELECT count(*) FROM log;
SELECT group_concat(id, ',') FROM (SELECT id FROM item WHERE name LIKE '%77%' ORDER BY id LIMIT 10);
BEGIN;
DELETE FROM sale WHERE qty < 25;
SELECT count(*) FROM sale;
ROLLBACK;
SELECT count(*) FROM sale;
SELECT hex(zeroblob(4)), typeof(1.5), typeof('x'), coalesce(NULL, 'fallback'), abs(-42), 7 / 2, 7 % 3;
PRAGMA integrity_check;
